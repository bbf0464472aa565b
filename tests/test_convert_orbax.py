"""convert --layout orbax: read back by orbax's own StandardCheckpointer, and Orbax directories as sources."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ocp = pytest.importorskip("orbax.checkpoint")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax.traverse_util import flatten_dict, unflatten_dict  # noqa: E402
from test_convert import _offline, convert, flax_params, safetensors_bits, tiny_mistral  # noqa: E402,F401

from guard.cli import main  # noqa: E402
from guard.write.orbax_layout import ZARR_DTYPES  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:  # with test_convert's _offline (imported above)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


def restore(path: Path) -> dict[tuple[str, ...], np.ndarray]:
    return {k: np.asarray(v) for k, v in flatten_dict(ocp.StandardCheckpointer().restore(path.resolve())).items()}


def bits(a: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    return a.dtype.name, a.shape, np.ascontiguousarray(a).tobytes()


def save_with_orbax(path: Path, tree: dict[tuple[str, ...], np.ndarray], **handler: object) -> None:
    """A checkpoint as JAX users write it: orbax's own StandardCheckpointHandler (OCDBT + zstd by default)."""
    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler(**handler))
    checkpointer.save(path.resolve(), args=ocp.args.StandardSave(unflatten_dict(tree)))


def test_orbax_layout_restores_bit_exact_and_converts_back(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path)
    assert convert(src, "--to", "flax", "--out", tmp_path / "msgpack") == 0
    assert convert(src, "--to", "flax", "--layout", "orbax", "--out", tmp_path / "orbax") == 0
    restored = restore(tmp_path / "orbax")
    reference = flax_params(tmp_path / "msgpack")  # the same tree transformers' FlaxMistral loads (test_convert)
    assert {k: bits(v) for k, v in restored.items()} == {k: bits(v) for k, v in reference.items()}
    assert {v.dtype.name for v in restored.values()} == {"bfloat16"}
    assert (tmp_path / "orbax" / "config.json").is_file()
    scan = tmp_path / "scan.json"
    assert main(["scan", str(tmp_path / "orbax"), "--expect", "bf16", "-f", "json", "-o", str(scan)]) == 0
    [model] = json.loads(scan.read_text())["models"]  # the scanner's own Orbax reader
    assert [(f["format"], f["tensors"]) for f in model["files"]] == [("orbax", len(reference))]
    report = tmp_path / "back.json"
    assert convert(tmp_path / "orbax", "--to", "torch", "--out", tmp_path / "back", "--verify", "full",
                   "-f", "json", "-o", report) == 0
    assert json.loads(report.read_text())["extra"]["conversion"]["verification"] == "full"
    assert safetensors_bits(tmp_path / "back") == safetensors_bits(src)
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors"]  # no Orbax files carried over


@pytest.mark.parametrize("handler", [{}, {"use_ocdbt": False}], ids=["ocdbt", "zarr"])
def test_checkpoint_written_by_orbax_converts_to_torch(tmp_path: Path, handler: dict) -> None:  # type: ignore[type-arg]
    src = tiny_mistral(tmp_path)
    assert convert(src, "--to", "flax", "--out", tmp_path / "msgpack") == 0
    ckpt = tmp_path / "ckpt"
    save_with_orbax(ckpt, flax_params(tmp_path / "msgpack"), **handler)
    shutil.copy(src / "config.json", ckpt / "config.json")
    assert convert(ckpt, "--to", "torch", "--out", tmp_path / "back") == 0
    assert safetensors_bits(tmp_path / "back") == safetensors_bits(src)


def test_every_dtype_and_nan_payloads_through_orbax(tmp_path: Path) -> None:
    from guard.write.bitviews import numpy_dtype

    rng = np.random.default_rng(0)
    tree = {}
    for code in ZARR_DTYPES:
        dtype = numpy_dtype(code)
        if code == "BOOL":
            tree[("t", code.lower())] = rng.integers(0, 2, size=(3, 5)).astype(bool)
        else:
            tree[("t", code.lower())] = rng.integers(0, 256, size=15 * dtype.itemsize, dtype=np.uint8).view(
                dtype).reshape(3, 5)
    tree[("t", "nan_bf16")] = np.array([0x7F81, 0xFFFF, 0xFF81], np.uint16).view(numpy_dtype("BF16"))
    tree[("t", "scalar")] = np.array(2.5, np.float32)
    src = tmp_path / "src"
    save_with_orbax(src, tree, use_ocdbt=False)
    assert convert(src, "--to", "flax", "--layout", "orbax", "--out", tmp_path / "out") == 0  # identity, re-laid
    assert {k: bits(v) for k, v in restore(tmp_path / "out").items()} == {k: bits(v) for k, v in tree.items()}
    assert json.loads((tmp_path / "out" / "t.bf16" / ".zarray").read_text())["compressor"] is None


def test_zero_size_and_0d_leaves(tmp_path: Path) -> None:
    """orbax itself refuses to save a zero-size array, but restores one; convert writes what the tree holds."""
    from flax.serialization import msgpack_serialize

    src = tmp_path / "src"
    src.mkdir()
    tree = {"empty": np.zeros((0, 4), np.float32), "scalar": np.array(3.0, np.float32)}
    (src / "flax_model.msgpack").write_bytes(msgpack_serialize(tree))  # Flax to Flax: names kept as they are
    assert convert(src, "--to", "flax", "--layout", "orbax", "--out", tmp_path / "out") == 0
    restored = restore(tmp_path / "out")
    assert bits(restored[("empty",)]) == ("float32", (0, 4), b"")
    assert bits(restored[("scalar",)]) == bits(tree["scalar"])


@pytest.mark.parametrize("defect", ["shape", "name"])
def test_a_different_tree_is_refused_naming_the_tensor(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       defect: str) -> None:
    src = tiny_mistral(tmp_path)
    assert convert(src, "--to", "flax", "--out", tmp_path / "msgpack") == 0
    tree = flax_params(tmp_path / "msgpack")
    key = ("model", "norm", "weight")
    if defect == "shape":
        tree[key] = np.zeros((17,), tree[key].dtype)  # a hidden size of 17 is not this config's
    else:
        tree[("model", "final_norm", "weight")] = tree.pop(key)  # a name Flax Mistral does not have
    ckpt = tmp_path / "ckpt"
    save_with_orbax(ckpt, tree)
    shutil.copy(src / "config.json", ckpt / "config.json")
    capsys.readouterr()
    assert convert(ckpt, "--to", "torch", "--out", tmp_path / "back") == 1
    refusals = [line for line in capsys.readouterr().out.splitlines() if "CG304" in line]
    named = "/".join(key) if defect == "shape" else "model/final_norm/weight"
    assert refusals and named in refusals[0] and ("[17]" in refusals[0]) == (defect == "shape")
    assert not (tmp_path / "back").exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.parametrize("key", [["..", "etc"], ["_METADATA"], ["a/b"]])
def test_hostile_metadata_keys_are_cg001(tmp_path: Path, key: list[str]) -> None:
    src = tmp_path / "ckpt"
    save_with_orbax(src, {("w",): np.ones(3, np.float32)}, use_ocdbt=False)
    meta = json.loads((src / "_METADATA").read_text())
    entry = next(iter(meta["tree_metadata"].values()))
    entry["key_metadata"] = [{"key": k, "key_type": 2} for k in key]
    meta["tree_metadata"] = {repr(tuple(key)): entry}
    (src / "_METADATA").write_text(json.dumps(meta))
    report = tmp_path / "r.json"
    assert convert(src, "--to", "torch", "--out", tmp_path / "out", "-f", "json", "-o", report) == 1
    [finding] = json.loads(report.read_text())["findings"]
    assert finding["code"] == "CG001" and "Orbax" in finding["message"]
    assert not (tmp_path / "out").exists()


def test_orbax_and_parity_or_torch_layout_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tiny_mistral(tmp_path, dtype=torch.float32)
    assert convert(src, "--to", "flax", "--layout", "orbax", "--parity", "--out", tmp_path / "a") == 2
    assert convert(tmp_path / "missing", "--to", "torch", "--layout", "orbax", "--out", tmp_path / "b") == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ckpt-guard: error:")]
    assert len(lines) == 2 and "Orbax" in lines[0]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _raw_checkpoint(tmp_path: Path, tree: dict[tuple[str, ...], np.ndarray]) -> Path:
    """convert's own Orbax layout (uncompressed single-chunk zarr2, no OCDBT) of a tree orbax saved."""
    save_with_orbax(tmp_path / "orbax-src", tree, use_ocdbt=False)
    out = tmp_path / "raw"
    assert convert(tmp_path / "orbax-src", "--to", "flax", "--layout", "orbax", "--out", out) == 0
    return out


def test_a_big_endian_zarr_array_is_decoded_not_copied(tmp_path: Path) -> None:
    """`>f4` parses as F32, but its bytes are big-endian: copying them raw would byte-swap every value."""
    tree = {("w",): np.arange(12, dtype=np.float32).reshape(3, 4) / 7}
    raw = _raw_checkpoint(tmp_path, tree)
    zarray = raw / "w" / ".zarray"
    meta = json.loads(zarray.read_text())
    assert meta["dtype"] == "<f4" and meta["compressor"] is None
    [chunk] = [p for p in (raw / "w").iterdir() if not p.name.startswith(".")]
    chunk.write_bytes(np.frombuffer(chunk.read_bytes(), "<f4").astype(">f4").tobytes())
    zarray.write_text(json.dumps({**meta, "dtype": ">f4"}))
    assert {k: v.tolist() for k, v in restore(raw).items()} == {k: v.tolist() for k, v in tree.items()}  # orbax agrees
    assert convert(raw, "--to", "flax", "--layout", "orbax", "--out", tmp_path / "again") == 0
    assert {k: bits(v) for k, v in restore(tmp_path / "again").items()} == {k: bits(v) for k, v in tree.items()}


def test_metadata_without_use_ocdbt_follows_the_manifest_as_the_scanner_does(tmp_path: Path) -> None:
    tree = {("w",): np.ones((2, 3), np.float32)}
    raw = _raw_checkpoint(tmp_path, tree)
    meta = json.loads((raw / "_METADATA").read_text())
    meta.pop("use_ocdbt", None)
    (raw / "_METADATA").write_text(json.dumps(meta))
    assert not (raw / "manifest.ocdbt").exists()
    assert convert(raw, "--to", "flax", "--layout", "orbax", "--out", tmp_path / "again") == 0
    assert {k: bits(v) for k, v in restore(tmp_path / "again").items()} == {k: bits(v) for k, v in tree.items()}


def test_convert_reads_metadata_through_the_scanners_reader_and_its_limit(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """One size limit for _METADATA and .zarray, scan and convert alike (guard.readers.orbax.MAX_JSON)."""
    from guard.convert.read.io_orbax import read_leaf, read_tree
    from guard.errors import MalformedCheckpoint
    from guard.readers import orbax

    src = tmp_path / "ckpt"
    save_with_orbax(src, {("w",): np.ones(3, np.float32)}, use_ocdbt=False)
    keys, ocdbt, zarr3 = read_tree(src)
    assert keys == [("w",)] and not ocdbt and not zarr3
    assert read_leaf(src, ("w",), ocdbt=False, zarr3=False).shape == (3,)
    monkeypatch.setattr(orbax, "MAX_JSON", (src / "w" / ".zarray").stat().st_size - 1)
    with pytest.raises(MalformedCheckpoint, match="metadata limit"):
        read_leaf(src, ("w",), ocdbt=False, zarr3=False)
    monkeypatch.setattr(orbax, "MAX_JSON", 8)
    with pytest.raises(MalformedCheckpoint, match="_METADATA is .* over the 8-byte metadata limit"):
        read_tree(src)
