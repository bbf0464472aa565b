"""The HDF5 reader against files h5py writes (Keras-2 tf_model.h5 layout included), and hostile ones.

transformers 4.57 writes a real tf_model.h5 only through TensorFlow, which is not
installed here; the Keras-2 layout (root ``layer_names``, per-layer ``weight_names``,
datasets ``<layer>/<scope>/<var>:0``) is written with h5py as Keras 2's
``save_weights_to_hdf5_group`` does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_inputs import assert_well_behaved, bounded_scan

from guard.cli import main
from guard.readers import scan_file, sniff_format
from guard.readers.hdf5 import file as hdf5_reader, walk as hdf5_walk
from guard.sources import BytesSource, LocalFile

h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")
sys.path.insert(0, str(Path(__file__).parent))
from real_writers import h5_listing  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def write_tf_model_h5(path: Path, *, dtype: object = np.float32) -> dict[str, tuple[str, tuple[int, ...]]]:
    """A BERT-like tf_model.h5 in the Keras-2 save_weights layout."""
    layers = {"bert": {"bert/embeddings/word_embeddings/weight:0": (30, 8),
                       "bert/embeddings/LayerNorm/gamma:0": (8,),
                       "bert/encoder/layer_._0/attention/self/query/kernel:0": (8, 8),
                       "bert/encoder/layer_._0/attention/self/query/bias:0": (8,)},
              "classifier": {"classifier/kernel:0": (8, 2), "classifier/bias:0": (2,)}}
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [name.encode() for name in layers]
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.15.0"
        for layer, weights in layers.items():
            group = f.create_group(layer)
            group.attrs["weight_names"] = [w.encode() for w in weights]
            for name, shape in weights.items():
                group.create_dataset(name, data=np.zeros(shape, dtype))
    with h5py.File(path, "r") as f:
        return {k: (v[0], tuple(v[1])) for k, v in h5_listing(f).items()}


def ours(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    with LocalFile(path) as source:
        scan = scan_file(source)
    assert not scan.findings, scan.findings
    return {t.name: (t.dtype, t.shape) for t in scan.tensors}


def test_tf_model_h5_reads_back_what_h5py_reports(tmp_path: Path) -> None:
    theirs = write_tf_model_h5(tmp_path / "tf_model.h5")
    assert ours(tmp_path / "tf_model.h5") == theirs
    with LocalFile(tmp_path / "tf_model.h5") as source:
        scan = scan_file(source)
    assert scan.format == "hdf5"
    assert scan.metadata == {"hdf5_layout": "keras2", "layers": "2"}
    assert "bert/bert/embeddings/word_embeddings/weight:0" in {t.name for t in scan.tensors}  # group + weight name


def test_every_h5py_dtype_maps_to_its_code(tmp_path: Path) -> None:
    path = tmp_path / "types.h5"
    with h5py.File(path, "w") as f:
        for dtype in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                      np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, ">f4"):
            f.create_dataset(f"t/{np.dtype(dtype).str}", data=np.zeros((2, 3), dtype))
        # Keras 3's H5IOStore: dtypes h5py lacks go in as opaque bytes plus a dtype attribute
        for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            raw = np.zeros((4,), getattr(ml_dtypes, name))
            ds = f.create_dataset(f"opaque/{name}", data=raw.view(f"V{raw.itemsize}"))
            ds.attrs["dtype"] = name
        f.create_dataset("scalar", data=np.float32(1.0))
        f.create_dataset("chunked", data=np.zeros((64, 64), np.float32), chunks=(8, 8), compression="gzip")
        f.create_dataset("strings", data=np.array([b"a", b"bc"]))
        f.create_dataset("empty", data=h5py.Empty("f4"))
    with LocalFile(path) as source:
        scan = scan_file(source)
    got = {t.name: (t.dtype, t.shape) for t in scan.tensors}
    assert got["t/<f2"] == ("F16", (2, 3)) and got["t/>f4"] == ("F32", (2, 3))
    assert got["t/|b1"][0] == "BOOL" and got["t/<c8"][0] == "C64" and got["t/<u8"][0] == "U64"
    assert got["opaque/bfloat16"] == ("BF16", (4,)) and got["opaque/float8_e4m3fn"][0] == "F8_E4M3"
    assert got["scalar"] == ("F32", ()) and got["chunked"] == ("F32", (64, 64))
    assert got["strings"][0] == "hdf5:|S2" and "empty" not in got
    assert [f.code for f in scan.findings] == ["CG005"]  # the string dataset, reported once
    with h5py.File(path, "r") as f:
        theirs = {k: (v[0], tuple(v[1])) for k, v in h5_listing(f).items()}
    assert {k: v for k, v in got.items() if k != "strings"} == {
        k: v for k, v in theirs.items() if k != "strings"}


def test_user_block_moves_the_signature(tmp_path: Path) -> None:
    path = tmp_path / "model.h5"
    with h5py.File(path, "w", userblock_size=1024) as f:
        f["w"] = np.ones((3,), np.float32)
    with LocalFile(path) as source:
        assert hdf5_reader.superblock_offset(source) == 1024
    assert ours(path) == {"w": ("F32", (3,))}
    # no suffix: the magic alone at 0 picks the reader
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["w"] = np.ones((1,), np.float16)
    data = (tmp_path / "plain.h5").read_bytes()
    assert sniff_format(BytesSource(data, name="weights.bin")) == "hdf5"


def test_remote_reads_are_ranged_and_few(tmp_path: Path) -> None:
    write_tf_model_h5(tmp_path / "tf_model.h5")
    with h5py.File(tmp_path / "big.h5", "w") as f:
        f["w"] = np.zeros((1024, 1024), np.float32)  # 4 MiB of data never read
    data = (tmp_path / "big.h5").read_bytes()
    source = BytesSource(data, name="big.h5")
    scan = scan_file(source)
    assert [t.name for t in scan.tensors] == ["w"]
    assert source.bytes_read < 16 * 1024, source.bytes_read


# ------------------------------------------------------------------ hostile files

def test_truncated_file_is_cg001(tmp_path: Path) -> None:
    write_tf_model_h5(tmp_path / "tf_model.h5")
    data = (tmp_path / "tf_model.h5").read_bytes()
    for cut in (0, 7, 100, len(data) // 2, len(data) - 1):
        result = bounded_scan(data[:cut], "tf_model.h5")
        assert_well_behaved(result, data[:cut])
        assert [f.code for f in result.scan.findings] == ["CG001"], cut


def test_cyclic_hard_links_soft_and_external_links_end(tmp_path: Path) -> None:
    outside = tmp_path / "outside.h5"
    with h5py.File(outside, "w") as f:
        f["secret"] = np.ones(2, np.float32)
    path = tmp_path / "cyclic.h5"
    with h5py.File(path, "w") as f:
        group = f.create_group("a/b")
        group["w"] = np.ones((2,), np.float32)
        group["up"] = f["a"]  # a -> b -> up == a: a cycle of hard links
        group["root"] = f
        f["soft"] = h5py.SoftLink("/a")
        f["loop"] = h5py.SoftLink("/loop")
        f["ext"] = h5py.ExternalLink(str(outside), "/")
    data = path.read_bytes()
    result = bounded_scan(data, "cyclic.h5")
    assert_well_behaved(result, data)
    assert result.inventory == {"a/b/w": ("F32", (2,))}  # each object once; no link followed out


def test_deep_groups_and_many_objects_are_cg001_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / "deep.h5"
    with h5py.File(deep, "w") as f:
        f.create_group("/".join(["g"] * 100))
    data = deep.read_bytes()
    result = bounded_scan(data, "deep.h5")
    assert_well_behaved(result, data)
    assert "nested more than" in result.reason
    many = tmp_path / "many.h5"
    with h5py.File(many, "w") as f:
        for i in range(300):
            f.create_group(f"g{i}")
    # the bound, not its size (20,000 objects ~ 16 MB), in-process: the worker has its own copy
    monkeypatch.setattr(hdf5_walk, "MAX_OBJECTS", 200)
    data = many.read_bytes()
    result = hdf5_walk.walk(hdf5_walk.CallbackFile(lambda at, n: data[at:at + n], len(data)), h5py)
    assert result == {"error": "more than 200 HDF5 objects"}


def test_a_libhdf5_hang_is_cg001(tmp_path: Path) -> None:
    """Found by the differential run: a corrupt vlen 'dtype' attribute makes HDF5 2.0 spin forever."""
    # kept out of fuzz/regressions/: the in-process atheris target would spin on it
    data = (ROOT / "tests" / "data" / "hdf5" / "vlen-attribute-spins.h5").read_bytes()
    result = bounded_scan(data, "model.weights.h5")
    assert [f.code for f in result.scan.findings] == ["CG001"]
    assert "made no progress" in result.reason
    again = bounded_scan(_small_h5(tmp_path), "ok.h5")
    assert again.valid  # the next file gets a fresh worker


def _small_h5(tmp_path: Path) -> bytes:
    with h5py.File(tmp_path / "ok.h5", "w") as f:
        f["w"] = np.ones(2, np.float32)
    return (tmp_path / "ok.h5").read_bytes()


def test_not_hdf5_with_an_h5_name_is_cg001() -> None:
    for data in (b"", b"hello world" * 10, b"\x89HDF\r\n\x1a\n" + b"\xff" * 200):
        result = bounded_scan(data, "tf_model.h5")
        assert_well_behaved(result, data)
        assert [f.code for f in result.scan.findings] == ["CG001"]


# ------------------------------------------------------------------ CLI, extra, light core

def test_cli_scan_of_a_tf_model_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "bert"
    model.mkdir()
    write_tf_model_h5(model / "tf_model.h5")
    (model / "config.json").write_text(json.dumps({"model_type": "bert", "torch_dtype": "float32"}))
    assert main(["scan", str(model), "--format", "json", "-o", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["models"][0]["files"][0]["format"] == "hdf5"
    assert not report["findings"]
    write_tf_model_h5(model / "tf_model.h5", dtype=np.float16)  # planted: fp16 weights, config fp32
    assert main(["scan", str(model), "--format", "json", "-o", str(tmp_path / "r.json")]) == 1
    codes = {f["code"] for f in json.loads((tmp_path / "r.json").read_text())["findings"]}
    assert {"CG101", "CG103"} <= codes
    (model / "tf_model.h5").write_bytes((model / "tf_model.h5").read_bytes()[:3000])  # truncated
    assert main(["scan", str(model), "--format", "json", "-o", str(tmp_path / "r.json")]) == 1
    assert "CG001" in {f["code"] for f in json.loads((tmp_path / "r.json").read_text())["findings"]}


def _child(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=60)


def test_without_h5py_an_hdf5_file_is_cg006_with_the_install_hint(tmp_path: Path) -> None:
    write_tf_model_h5(tmp_path / "tf_model.h5")
    code = ("import sys; sys.modules['h5py'] = None\n"
            "from guard.cli import main\n"
            "raise SystemExit(main(['scan', sys.argv[1], '--format', 'json', '-o', 'r.json', '--fail-on', 'never']))")
    proc = _child(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads((tmp_path / "r.json").read_text())["findings"]
    assert [f["code"] for f in findings] == ["CG006"]
    assert "pip install 'ckpt-guard[hdf5]'" in findings[0]["message"]


def test_a_scan_without_hdf5_files_never_imports_h5py(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    code = ("import sys\nfrom guard.cli import main\n"
            "rc = main(['scan', sys.argv[1], '-o', 'r.txt'])\n"
            "heavy = sorted(m for m in ('h5py', 'numpy', 'tensorstore', 'keras') if m in sys.modules)\n"
            "raise SystemExit(f'imported {heavy}' if heavy else rc)")
    proc = _child(code, tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout



# ------------------------------------------------------------------ property: any h5py file reads back

from hypothesis import (  # noqa: E402
    HealthCheck,
    given,
    settings,
    strategies as st,  # noqa: E402
)

H5_DTYPES = ["f2", "f4", "f8", ">f4", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "?", "c8", "bfloat16"]
h5_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789_:.", min_size=1, max_size=8).filter(
    lambda n: n not in (".", ".."))


@settings(max_examples=25, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(h5_names, min_size=1, max_size=4), st.sampled_from(H5_DTYPES),
                          st.lists(st.integers(0, 3), max_size=3), st.booleans()),
                min_size=1, max_size=6),
       st.sampled_from(["earliest", "latest"]))
def test_any_h5py_file_reads_back_what_h5py_reports(tmp_path: Path, datasets: list, libver: str) -> None:
    path = tmp_path / "w.h5"
    path.unlink(missing_ok=True)
    with h5py.File(path, "w", libver=(libver, "latest")) as f:
        for parts, dtype, shape, chunked in datasets:
            name = "/".join(parts)
            if name in f or any("/".join(parts[:i]) in f and isinstance(f["/".join(parts[:i])], h5py.Dataset)
                                for i in range(1, len(parts))):
                continue
            value = np.zeros(shape, getattr(ml_dtypes, dtype) if dtype == "bfloat16" else dtype)
            chunks = tuple(max(1, d) for d in shape) if chunked and shape and all(shape) else None
            if dtype == "bfloat16":
                f.create_dataset(name, data=value.view("V2")).attrs["dtype"] = "bfloat16"
            else:
                f.create_dataset(name, data=value, chunks=chunks)
    with h5py.File(path, "r") as f:
        theirs = {k: (v[0], tuple(v[1])) for k, v in h5_listing(f).items()}
    assert ours(path) == theirs


def test_a_crash_of_libhdf5_is_cg001_and_the_next_file_still_reads(tmp_path: Path) -> None:
    """The worker dies mid-walk (as on a segfault in libhdf5): CG001 for that file, a fresh worker next."""
    import os
    import signal

    from guard.readers.hdf5 import worker as hdf5_worker

    data = _small_h5(tmp_path)

    class Crashing(BytesSource):
        def read_at(self, offset: int, size: int) -> bytes:
            proc = hdf5_worker._WORKER._proc
            if proc is not None and proc.poll() is None:  # the sniff reads before the walk starts
                os.kill(proc.pid, signal.SIGSEGV)
                proc.wait()
            return super().read_at(offset, size)

    scan = scan_file(Crashing(data, name="model.h5"))
    assert [f.code for f in scan.findings] == ["CG001"]
    assert "crashed" in scan.findings[0].message
    assert bounded_scan(data, "model.h5").inventory == {"w": ("F32", (2,))}
