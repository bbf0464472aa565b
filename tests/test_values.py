"""scan --values: CG201-CG204 from tensor data, exact counts, bounded memory, bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from bounds import traced

ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.config import Policy, Target  # noqa: E402
from guard.errors import MissingExtraError  # noqa: E402
from guard.inventory import ModelInventory, discover_models, load_local_model  # noqa: E402
from guard.tensors import FileScan, TensorInfo  # noqa: E402
from guard.values.check import value_findings  # noqa: E402
from guard.values.stats import cast_is_exact, cast_limits  # noqa: E402

NAN, INF = float("nan"), float("inf")
FP16 = (Target("torch", "F16"),)


def model(tmp_path: Path, tensors: dict[str, torch.Tensor], name: str = "m") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def values(directory: Path, **policy: object):  # type: ignore[no-untyped-def]
    inv = load_local_model(discover_models([directory])[0])
    return value_findings(inv, Policy(**policy))  # type: ignore[arg-type]


def by_tensor(results) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {row["tensor"]: row for row in results.stats}


def codes(results) -> list[tuple[str, str | None]]:  # type: ignore[no-untyped-def]
    return sorted((f.code, f.tensor) for f in results.findings)


def test_known_values_exact_counts_and_worst(tmp_path: Path) -> None:
    d = model(tmp_path, {
        "f32": torch.tensor([1.0, NAN, INF, -INF, 70000.0, 1e-9, -3.0, 0.0]),
        "bf16": torch.tensor([1.0, -1e5, 70000.0, 1e-9, 3e-6, 2.0**-20, 0.0], dtype=torch.bfloat16),
        "f16": torch.tensor([1.0, -2.0, 65504.0], dtype=torch.float16),
        "ids": torch.arange(4),
    })
    res = values(d, targets=FP16)
    rows = by_tensor(res)
    assert set(rows) == {"f32", "bf16", "f16"}  # integers are not value-checked
    f32 = rows["f32"]
    assert (f32["nan"], f32["inf"], f32["max_abs"], f32["worst_value"]) == (1, 2, 70000.0, 70000.0)
    assert f32["min_nonzero_abs"] == pytest.approx(1e-9, rel=1e-7)
    assert f32["casts"]["fp16"] == {"overflow": 1, "flush": 1, "inexact_subnormal": 0, "rounded": 0,
                                    "max_rel_error": 0.0, "worst_rel_value": None}
    bf16 = rows["bf16"]
    assert (bf16["nan"], bf16["inf"], bf16["worst_value"]) == (0, 0, -99840.0)  # -1e5 in bf16
    # 1e-9 flushes; 3e-6 survives rounded; 2^-20 is a multiple of 2^-24: exact in fp16.
    assert bf16["casts"]["fp16"]["overflow"] == 2
    assert (bf16["casts"]["fp16"]["flush"], bf16["casts"]["fp16"]["inexact_subnormal"]) == (1, 1)
    assert rows["f16"]["casts"] == {}  # nothing to cast: already fp16
    assert codes(res) == [("CG201", "bf16"), ("CG201", "f32"), ("CG202", "bf16"), ("CG202", "f32"),
                          ("CG203", "f32")]
    cg203 = next(f for f in res.findings if f.code == "CG203")
    assert "3 non-finite" in cg203.message and "1 NaN, 2 Inf" in cg203.message
    cg201 = next(f for f in res.findings if f.code == "CG201" and f.tensor == "bf16")
    assert "2 value(s)" in cg201.message and "-99840" in cg201.message and "torch:fp16" in cg201.message


def test_without_a_cast_only_non_finite_values_are_findings(tmp_path: Path) -> None:
    d = model(tmp_path, {"w": torch.tensor([NAN, 70000.0, 1e-9])})
    res = values(d)
    assert codes(res) == [("CG203", "w")]
    assert by_tensor(res)["w"]["casts"]["fp16"]["overflow"] == 1  # the figure is still there


def test_expect_fp16_puts_the_fp16_cast_in_play(tmp_path: Path) -> None:
    d = model(tmp_path, {"w": torch.tensor([70000.0, 1.0])})
    assert codes(values(d, expect="F16")) == [("CG201", "w")]


@pytest.mark.parametrize(("dtype", "value", "overflows"), [
    (torch.bfloat16, 65280.0, False),  # the largest bf16 <= 65504
    (torch.bfloat16, 65536.0, True),
    (torch.float32, 65519.0, False),  # rounds down to 65504
    (torch.float32, 65520.0, True),  # rounds to inf
    (torch.float64, -65520.0, True),
])
def test_fp16_overflow_boundary_is_the_cast_itself(tmp_path: Path, dtype: torch.dtype, value: float,
                                                    overflows: bool) -> None:
    d = model(tmp_path, {"w": torch.tensor([value, 1.0], dtype=dtype)})
    assert by_tensor(values(d, targets=FP16))["w"]["casts"]["fp16"]["overflow"] == int(overflows)
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(value)) == overflows


def test_fp16_underflow_counts_match_numpy_on_random_bf16(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(300_000, generator=g) * 1e-4).to(torch.bfloat16)
    d = model(tmp_path, {"w": w})
    cast = by_tensor(values(d, targets=FP16))["w"]["casts"]["fp16"]
    x = w.view(torch.int16).numpy().view(ml_dtypes.bfloat16).astype(np.float64)
    tiny = x[(x != 0) & (np.abs(x) < 2.0**-14)]
    back = tiny.astype(np.float16).astype(np.float64)
    assert cast["flush"] == int(np.count_nonzero(back == 0))
    assert cast["inexact_subnormal"] == int(np.count_nonzero((back != tiny) & (back != 0)))
    assert cast["flush"] > 0 and cast["inexact_subnormal"] > 0


def test_lossy_downcast_is_one_note_per_file_and_target(tmp_path: Path) -> None:
    d = model(tmp_path, {"a": torch.tensor([1.0, 1.0 + 2.0**-8, 3.0]), "b": torch.tensor([1.0, 1.0078125])})
    res = values(d, targets=(Target("flax", "BF16"),))
    assert codes(res) == [("CG204", "a")]
    rows = by_tensor(res)
    assert rows["a"]["casts"]["bf16"]["max_rel_error"] == pytest.approx(2.0**-8 / (1 + 2.0**-8))
    assert rows["a"]["casts"]["bf16"]["rounded"] == 1 and rows["b"]["casts"]["bf16"]["rounded"] == 0
    assert "flax:bf16" in res.findings[0].message


def test_widening_and_exact_casts_are_never_lossy() -> None:
    assert cast_is_exact("BF16", "F32") and cast_is_exact("F16", "F32") and cast_is_exact("F8_E4M3", "F16")
    assert not cast_is_exact("F16", "BF16") and not cast_is_exact("BF16", "F16")
    limits = cast_limits("BF16", "F16")
    assert (limits.overflow, limits.normal) == (0x4780, 0x3880)  # 65536 and 2^-14


def test_fp8_f64_and_complex_tensors(tmp_path: Path) -> None:
    d = model(tmp_path, {
        "e4": torch.tensor([1.0, 448.0, NAN]).to(torch.float8_e4m3fn),
        "e5": torch.tensor([1.0, INF, 2.0**-16]).to(torch.float8_e5m2),
        "d": torch.tensor([1.0, 1e300, NAN], dtype=torch.float64),
        "c": torch.tensor([1 + 1j, complex(NAN, 0)], dtype=torch.complex64),
    })
    res = values(d, targets=(Target("torch", "F8_E4M3"),))
    rows = by_tensor(res)
    assert (rows["e4"]["nan"], rows["e4"]["max_abs"]) == (1, 448.0)
    assert (rows["e5"]["inf"], rows["e5"]["casts"]["F8_E4M3"]["overflow"]) == (1, 0)
    assert rows["e5"]["casts"]["F8_E4M3"]["flush"] == 1  # 2^-16 is below e4m3's subnormals
    assert (rows["d"]["nan"], rows["d"]["casts"]["F8_E4M3"]["overflow"]) == (1, 1)
    assert (rows["c"]["nan"], rows["c"]["numel"]) == (1, 2)
    assert ("CG203", "c") in codes(res) and ("CG201", "d") in codes(res)


def test_torch_zip_views_and_legacy_files_are_read(tmp_path: Path) -> None:
    d = tmp_path / "tz"
    d.mkdir()
    w = torch.tensor([[1.0, NAN], [70000.0, 2.0]])
    torch.save({"w": w, "wt": w.T, "row": w[1]}, d / "pytorch_model.bin")
    torch.save({"w": w}, d / "old.bin", _use_new_zipfile_serialization=False)
    res = values(d, targets=FP16)
    stats = {(Path(r["file"]).name, r["tensor"]): r for r in res.stats}
    assert all("skipped" not in r for r in stats.values())
    assert stats[("pytorch_model.bin", "wt")]["nan"] == 1
    assert stats[("pytorch_model.bin", "row")]["casts"]["fp16"]["overflow"] == 1
    assert stats[("pytorch_model.bin", "row")]["nan"] == 0
    assert stats[("old.bin", "w")]["nan"] == 1


def test_flax_msgpack_file_is_read(tmp_path: Path) -> None:
    serialization = pytest.importorskip("flax.serialization")
    d = tmp_path / "fx"
    d.mkdir()
    params = {"params": {"dense": {"kernel": np.array([[1.0, np.inf]], np.float32),
                                   "bias": np.array([1e-9], ml_dtypes.bfloat16)}}}
    (d / "flax_model.msgpack").write_bytes(serialization.msgpack_serialize(params))
    rows = by_tensor(values(d, targets=FP16))
    kernel = next(v for k, v in rows.items() if k.endswith("kernel"))
    bias = next(v for k, v in rows.items() if k.endswith("bias"))
    assert kernel["inf"] == 1 and bias["casts"]["fp16"]["flush"] == 1


def test_scan_values_cli_reports_nan_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = model(tmp_path, {"layer.weight": torch.tensor([1.0, NAN, 2.0])})
    out = tmp_path / "r.json"
    assert main(["scan", "--values", str(d), "-f", "json", "-o", str(out)]) == 1
    report = json.loads(out.read_text())
    assert [f["code"] for f in report["findings"]] == ["CG203"]
    assert report["extra"]["values"][0]["tensor"] == "layer.weight"
    assert main(["scan", str(d)]) == 0  # without --values the data is never read


def test_truncated_file_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    d = model(tmp_path, {"w": torch.ones(1000)})
    path = d / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    assert main(["scan", "--values", str(d)]) == 1  # CG001 from the reader, no traceback


def test_tensor_bytes_past_end_of_file_are_cg001(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\0" * 64)
    info = TensorInfo("w", "F32", (100,), str(path), 16, 416)
    inv = ModelInventory(path=str(tmp_path), files=[FileScan(str(path), "safetensors", 64, (info,))])
    res = value_findings(inv, Policy())
    assert [(f.code, f.tensor) for f in res.findings] == [("CG001", "w")]
    assert "truncated" in res.stats[0]["skipped"]


def test_unlocated_and_strided_tensors_are_skipped_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 64)
    infos = (TensorInfo("chunked", "F32", (4,), str(path)),
             TensorInfo("view", "F32", (2,), str(path), 0, 12, stride=(2,)))
    inv = ModelInventory(path=str(tmp_path), files=[FileScan(str(path), "flax-msgpack", 64, infos)])
    res = value_findings(inv, Policy())
    assert res.findings == []
    assert [("skipped" in r) for r in res.stats] == [True, True]


def test_missing_numpy_is_a_one_line_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(MissingExtraError, match=r"ckpt-guard\[values\]"):
        value_findings(ModelInventory(path=str(tmp_path)), Policy())


def _peak_scan_bytes(tmp_path: Path, name: str, megabytes: int) -> int:
    n = megabytes * 1024 * 1024 // 2
    d = model(tmp_path, {"w": (torch.randn(n) * 0.02).to(torch.bfloat16)}, name=name)
    inv = load_local_model(discover_models([d])[0])
    with traced() as peak:
        value_findings(inv, Policy(targets=FP16))
    return peak.bytes


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_model(tmp_path: Path) -> None:
    small = _peak_scan_bytes(tmp_path, "small", 48)
    large = _peak_scan_bytes(tmp_path, "large", 200)
    assert large < 160 * 1024 * 1024  # well under the 200 MB being scanned
    assert large - small < 8 * 1024 * 1024, (small, large)
