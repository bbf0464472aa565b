"""Keras 3 (.keras, .weights.h5, sharded .weights.json) written by Keras itself (JAX backend).

The files are written once per module by a child process (tests/real_writers.py);
h5py's listing of each weights member is the reference.  Keras 3.15 stores every
member of a .keras zip (no compression), and the mixed policies keep F32 variables.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fuzz_inputs import assert_well_behaved, bounded_scan

from guard.cli import main
from guard.readers import scan_file, sniff_format
from guard.sources import BytesSource, LocalFile

pytest.importorskip("h5py")
if importlib.util.find_spec("keras") is None:  # imported only in the writer child (KERAS_BACKEND=jax)
    pytest.skip("keras is not installed", allow_module_level=True)
sys.path.insert(0, str(Path(__file__).parent))
from real_writers import POLICIES, built  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
VARIABLE_DTYPE = {"float32": "F32", "mixed_float16": "F32", "mixed_bfloat16": "F32", "bfloat16": "BF16"}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return built("keras", tmp_path_factory)


def scan(path: Path) -> Any:
    with LocalFile(path) as source:
        return scan_file(source)


def test_keras_writes_members_stored(written: tuple[Path, dict[str, Any]]) -> None:
    _out, reference = written
    assert {reference[f"{kind}_{p}.keras"]["compress_type"] for kind in ("seq", "fn") for p in POLICIES} == {
        zipfile.ZIP_STORED}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", ["seq", "fn"])
def test_keras_archive_reads_back_what_h5py_reports(written: tuple[Path, dict[str, Any]], kind: str,
                                                    policy: str) -> None:
    out, reference = written
    result = scan(out / f"{kind}_{policy}.keras")
    assert result.format == "keras" and not result.findings
    assert {t.name: [t.dtype, list(t.shape)] for t in result.tensors} == reference[f"{kind}_{policy}.keras"]["tensors"]
    assert {t.dtype for t in result.tensors} == {VARIABLE_DTYPE[policy]}  # what Keras stores
    assert result.metadata["declared_dtype"] == VARIABLE_DTYPE[policy]
    assert repr(policy) in result.metadata["declared_dtype_source"]
    assert result.metadata["keras_version"].startswith("3.")


@pytest.mark.parametrize("policy", POLICIES)
def test_weights_h5_reads_back_what_h5py_reports(written: tuple[Path, dict[str, Any]], policy: str) -> None:
    out, reference = written
    result = scan(out / f"fn_{policy}.weights.h5")
    assert result.format == "hdf5" and not result.findings
    assert {t.name: [t.dtype, list(t.shape)] for t in result.tensors} == reference[f"fn_{policy}.weights.h5"]["tensors"]


def test_sharded_weights_each_shard_is_read(written: tuple[Path, dict[str, Any]]) -> None:
    out, reference = written
    shards = [n for n in reference["sharded"] if n.endswith(".weights.h5")]
    assert len(shards) > 1 and "sharded.weights.json" in reference["sharded"]
    index = json.loads((out / "sharded.weights.json").read_text())
    named = {s for v in index["weight_map"].values() for s in (v if isinstance(v, list) else [v])}
    assert named == set(shards)
    total = [t for shard in shards for t in scan(out / shard).tensors]
    assert len(total) == 8 and {t.dtype for t in total} == {"F32"}  # 4 Dense layers: kernel + bias


def test_a_keras_zip_is_not_a_torch_checkpoint(written: tuple[Path, dict[str, Any]]) -> None:
    out, _ = written
    data = (out / "seq_float32.keras").read_bytes()
    assert sniff_format(BytesSource(data, name="m.keras")) == "keras"
    assert sniff_format(BytesSource(data, name="pytorch_model.bin")) == "torch-zip"


def _rezip(data: bytes, *, compression: int = zipfile.ZIP_STORED, replace: dict[str, bytes] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buffer, "w", compression=compression) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, (replace or {}).get(info.filename, src.read(info)))
    return buffer.getvalue()


def test_a_deflated_weights_member_is_inflated_within_bounds(written: tuple[Path, dict[str, Any]]) -> None:
    out, reference = written
    data = _rezip((out / "fn_bfloat16.keras").read_bytes(), compression=zipfile.ZIP_DEFLATED)
    result = bounded_scan(data, "m.keras")
    assert_well_behaved(result, data)
    assert {k: [v[0], list(v[1])] for k, v in result.inventory.items()} == reference["fn_bfloat16.keras"]["tensors"]


# ------------------------------------------------------------------ hostile archives

def _lie_about_sizes(data: bytes, member: str, size: int) -> bytes:
    """Rewrite a member's uncompressed size in its local and central headers (a lying zip bomb)."""
    out = bytearray(data)
    name = member.encode()
    for sig, at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        pos = out.find(sig)
        while pos >= 0:
            name_at = pos + (30 if sig == b"PK\x03\x04" else 46)
            if out[name_at:name_at + len(name)] == name:
                out[pos + at:pos + at + 4] = size.to_bytes(4, "little")
            pos = out.find(sig, pos + 4)
    return bytes(out)


def test_zip_bombs_are_cg001_fast_and_small(written: tuple[Path, dict[str, Any]]) -> None:
    out, _ = written
    base = (out / "seq_float32.keras").read_bytes()
    bomb = b"{" + b" " * (40 * 1024 * 1024) + b"}"  # 40 MB of JSON whitespace, ~40 KB deflated
    honest = _rezip(base, compression=zipfile.ZIP_DEFLATED, replace={"config.json": bomb})
    lying = _lie_about_sizes(honest, "config.json", 3000)
    weights = zipfile.ZipFile(io.BytesIO(base)).read("model.weights.h5")
    lying_weights = _lie_about_sizes(_rezip(base, compression=zipfile.ZIP_DEFLATED, replace={
        "model.weights.h5": weights + b"\0" * (40 * 1024 * 1024)}), "model.weights.h5", len(weights))
    for data in (honest, lying, lying_weights):
        result = bounded_scan(data, "model.keras")
        assert_well_behaved(result, data)
        assert [f.code for f in result.scan.findings] == ["CG001"], result.scan.findings


def test_truncated_and_broken_archives_are_cg001(written: tuple[Path, dict[str, Any]]) -> None:
    out, _ = written
    data = (out / "fn_mixed_float16.keras").read_bytes()
    without_config = _drop(data, "config.json")
    cases = [data[:cut] for cut in (10, len(data) // 2, len(data) - 30)]
    cases += [_rezip(data, replace={"config.json": b"{not json"}), without_config,
              _drop(data, "model.weights.h5"),
              _rezip(data, replace={"model.weights.h5": b"\x89HDF\r\n\x1a\n" + b"\0" * 64})]
    for case in cases:
        result = bounded_scan(case, "model.keras")
        assert_well_behaved(result, case)
        assert [f.code for f in result.scan.findings] == ["CG001"], result.scan.findings


def _drop(data: bytes, member: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buffer, "w") as dst:
        for info in src.infolist():
            if info.filename != member:
                dst.writestr(info, src.read(info))
    return buffer.getvalue()


# ------------------------------------------------------------------ end to end

def _report(tmp_path: Path, *args: str) -> tuple[int, set[str]]:
    rc = main(["scan", *args, "--format", "json", "-o", str(tmp_path / "r.json")])
    return rc, {f["code"] for f in json.loads((tmp_path / "r.json").read_text())["findings"]}


def test_cli_expert_verdicts(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, _ = written
    for policy, expect, verdict in (("float32", "fp32", (0, set())), ("mixed_float16", "fp32", (0, set())),
                                    ("mixed_bfloat16", "fp32", (0, set())),
                                    ("bfloat16", "fp32", (1, {"CG101", "CG104"})),
                                    ("bfloat16", "bf16", (0, {"CG104"}))):
        model = tmp_path / f"{policy}-{expect}"
        model.mkdir()
        shutil.copy(out / f"fn_{policy}.keras", model / "model.keras")
        assert _report(tmp_path, str(model), "--expect", expect) == verdict, (policy, expect)


def test_cli_policy_that_disagrees_with_the_weights_is_cg103(written: tuple[Path, dict[str, Any]],
                                                              tmp_path: Path) -> None:
    out, _ = written
    data = (out / "seq_float32.keras").read_bytes()
    config = json.loads(zipfile.ZipFile(io.BytesIO(data)).read("config.json"))
    for layer in config["config"]["layers"][1:]:  # planted: the layers' policies bf16, variables F32
        layer["config"]["dtype"]["config"]["name"] = "bfloat16"
    (tmp_path / "model.keras").write_bytes(_rezip(data, replace={"config.json": json.dumps(config).encode()}))
    assert "CG103" in _report(tmp_path, str(tmp_path / "model.keras"))[1]  # tests/test_keras_policies.py: more


def test_cli_truncated_keras_is_cg001(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, _ = written
    (tmp_path / "model.keras").write_bytes((out / "seq_float32.keras").read_bytes()[:-100])
    assert _report(tmp_path, str(tmp_path / "model.keras")) == (1, {"CG001"})


def test_cli_without_h5py_keras_is_cg006(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, _ = written
    shutil.copy(out / "seq_bfloat16.keras", tmp_path / "model.keras")
    code = ("import sys; sys.modules['h5py'] = None\nfrom guard.cli import main\n"
            "raise SystemExit(main(['scan', 'model.keras', '--format', 'json', '-o', 'r.json']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads((tmp_path / "r.json").read_text())["findings"]
    assert [f["code"] for f in findings] == ["CG006"] and "ckpt-guard[hdf5]" in findings[0]["message"]


def test_declared_policy_of_quantized_and_odd_configs() -> None:
    from guard.readers.hdf5.keras import declared_policy

    quantized = {"config": {"dtype": {"class_name": "QuantizedDTypePolicy",
                                      "config": {"mode": "int8", "source_name": "mixed_bfloat16"}}}}
    assert declared_policy(quantized) == {"keras_quantization": "int8"}
    assert declared_policy({"config": {"dtype": "float16"}})["declared_dtype"] == "F16"
    assert declared_policy({"config": {"layers": [{"class_name": "InputLayer", "config": {"dtype": "int32"}}]}}) == {}
    assert declared_policy({"config": {"dtype": "int8_from_nowhere"}}) == {
        "declared_dtype_source": "config.json config.dtype: Keras dtype policy 'int8_from_nowhere'"}
    assert declared_policy({"config": []}) == {} and declared_policy({}) == {}
