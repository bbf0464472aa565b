"""The value scan's bf16/fp8 arithmetic from integer bits (``guard.values.minifloats``) against ml_dtypes.

The scan no longer imports ml_dtypes (0.7.0 takes ~0.75 s to import); what it computed with ml_dtypes'
casts it now computes from bit fields.  These tests hold the two equal: every bit pattern of bf16, fp16
and each fp8 format, decoded and cast, and the scan's derived tables (exact casts, range limits,
underflow fates) recomputed the way the kernel computed them with ml_dtypes.

A float64 is rounded through float32, as torch rounds it (``c10::BFloat16`` and the ``Float8_*`` types
are built from a float) and as ml_dtypes did up to 0.6.  ml_dtypes 0.7 rounds a float64 once, so its
direct float64 casts differ from torch's at a few ties: the references below narrow to float32 first,
and one test holds the float64 rounding to torch's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

from guard.values import minifloats, stats  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ML = {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
      "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
      "F8_E8M0": ml_dtypes.float8_e8m0fnu}
NATIVE = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
TARGETS = [code for code in stats.CAST_TARGETS if code in ML]  # the casts minifloats does itself
SOURCES_16 = ("F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")


def every_pattern(code: str) -> Any:
    width = np.uint8 if code.startswith("F8") else np.uint16
    return np.arange(1 << (8 * np.dtype(width).itemsize), dtype=np.uint32).astype(width)


def assert_same_values(got: Any, want: Any) -> None:
    """Equal values, NaN where NaN, and the sign of every zero and infinity."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))


@pytest.mark.parametrize("code", list(ML) + ["F16"])
def test_every_pattern_decodes_as_ml_dtypes_does(code: str) -> None:
    bits = every_pattern(code)
    reference = NATIVE.get(code) or ML[code]
    with np.errstate(invalid="ignore"):
        want = bits.view(reference).astype(np.float32)
    got = minifloats.to_float32(code, bits)
    assert_same_values(got, want)
    if code == "BF16":  # bf16 is fp32's top half: even the NaN payloads come through
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("code", list(ML))
def test_limits_are_ml_dtypes_finfo(code: str) -> None:
    info = ml_dtypes.finfo(ML[code])
    assert minifloats.largest(code) == float(info.max)
    assert minifloats.smallest_normal(code) == float(info.smallest_normal)
    assert minifloats.itemsize(code) == np.dtype(ML[code]).itemsize
    if code.startswith("F8"):
        assert minifloats.largest_bits(code) == int(np.array(info.max, dtype=ML[code]).view(np.uint8))


def _inputs() -> dict[str, Any]:
    rng = np.random.default_rng(31)
    with np.errstate(invalid="ignore"):  # NaN patterns
        patterns = {code: every_pattern(code).view(NATIVE.get(code) or ML[code]).astype(np.float32)
                    for code in SOURCES_16}
        ties = np.concatenate([p.astype(np.float64) for p in patterns.values()])
    random32 = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # float64 values around every format's grid: ml_dtypes rounds a float64 through float32 first
    random64 = rng.normal(size=1 << 18) * np.exp2(rng.integers(-150, 131, 1 << 18).astype(np.float64))
    ties = np.concatenate([ties * (1 + 2.0 ** -k) for k in (4, 5, 8, 9, 24, 40)])
    return {**{f"every {code} pattern": p for code, p in patterns.items()},
            "random fp32 patterns": random32, "random fp64 values": random64, "fp64 near ties": ties}


INPUTS = _inputs()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("inputs", list(INPUTS))
def test_cast_back_is_ml_dtypes_round_trip(target: str, inputs: str) -> None:
    x = INPUTS[inputs]
    with np.errstate(invalid="ignore"):
        wide = x.astype(np.float64)
    for values in ([x] if x.dtype == np.float64 else [x, wide]):
        with np.errstate(all="ignore"):
            want = ml_cast(values, target).astype(values.dtype)
            got = minifloats.cast_back(values, target)
        assert_same_values(got, want)


def ml_cast(values: Any, code: str) -> Any:
    """``values`` cast to ``code`` with ml_dtypes, a float64 through float32 (torch's rounding)."""
    with np.errstate(all="ignore"):
        if values.dtype == np.float64 and code not in NATIVE:
            values = values.astype(np.float32)
        return values.astype(_reference_dtype(code))


@pytest.mark.parametrize("target", TARGETS)
def test_float64_rounds_as_torch_rounds(target: str) -> None:
    """Near every tie of every format, from float64: torch's cast, bit for bit (as values)."""
    torch = pytest.importorskip("torch")
    names = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
             "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz"}
    values = INPUTS["fp64 near ties"]
    with np.errstate(all="ignore"):
        values = values[np.isfinite(values) & (np.abs(values) < 1e38)]  # torch's fp8 casts saturate nothing here
        want = torch.from_numpy(values).to(getattr(torch, names[target])).to(torch.float64).numpy()
        got = minifloats.cast_back(values, target)
    if target.startswith("F8_E4M3") or target == "F8_E5M2FNUZ":  # no inf: torch gives NaN past the range too
        keep = np.abs(values) < minifloats.largest(target)
        got, want = got[keep], want[keep]
    assert_same_values(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_cast_back_from_fp16_arrays_is_ml_dtypes_round_trip(target: str) -> None:
    """The kernel keeps fp16 tensors in fp16: ml_dtypes cast those directly."""
    values = every_pattern("F16").view(np.float16)
    with np.errstate(all="ignore"):
        want = values.astype(ML[target]).astype(np.float16)
        got = minifloats.cast_back(values, target)
    assert_same_values(got, want)


def _reference_dtype(code: str) -> Any:
    return np.dtype(NATIVE[code]) if code in NATIVE else np.dtype(ML[code])


def _old_cast_is_exact(source: str, target: str) -> bool:
    """The kernel's formula before minifloats, with ml_dtypes."""
    if source == target:
        return True
    src = _reference_dtype(source)
    if src.itemsize > 2:
        return (source, target) == ("F32", "F64")
    with np.errstate(all="ignore"):
        values = every_pattern(source).view(src).astype(np.float64)
        values = values[np.isfinite(values)]
        return bool(np.array_equal(values, values.astype(_reference_dtype(target)).astype(np.float64)))


def _old_rounds_in_range(source: str, target: str) -> bool:
    if _old_cast_is_exact(source, target):
        return False
    src, dst = _reference_dtype(source), _reference_dtype(target)
    if src.itemsize > 2:
        return True
    with np.errstate(all="ignore"):
        values = every_pattern(source).view(src).astype(np.float64)
        info = ml_dtypes.finfo(dst)
        values = values[(np.abs(values) >= float(info.smallest_normal)) & (np.abs(values) <= float(info.max))]
        return not np.array_equal(values, values.astype(dst).astype(np.float64))


ALL_SOURCES = SOURCES_16 + ("F32", "F64")


@pytest.mark.parametrize("source", ALL_SOURCES)
def test_exact_and_rounding_verdicts_are_unchanged(source: str) -> None:
    stats.cast_is_exact.cache_clear()
    stats.rounds_in_range.cache_clear()
    for target in stats.CAST_TARGETS:
        assert stats.cast_is_exact(source, target) == _old_cast_is_exact(source, target), target
        assert stats.rounds_in_range(source, target) == _old_rounds_in_range(source, target), target


@pytest.mark.parametrize("source", list(stats.IEEE_BITS))
def test_range_limits_are_unchanged(source: str) -> None:
    """The first overflowing and first normal magnitude, searched with ml_dtypes' casts as before."""
    uint, _mask, inf_bits = stats.IEEE_BITS[source]
    src = _reference_dtype(source)
    for target in stats.CAST_TARGETS:
        dst = _reference_dtype(target)
        tiny = float(ml_dtypes.finfo(dst).smallest_normal)

        def value(bits: int) -> float:
            return float(np.array([bits], dtype=uint).view(src)[0])

        def overflows(bits: int) -> bool:
            return not np.isfinite(ml_cast(np.array([value(bits)], dtype=src), target)[0])  # noqa: B023 (called within this iteration)

        limits = stats.cast_limits(source, target)
        assert limits.overflow == stats._first_true(overflows, inf_bits), target
        assert limits.normal == stats._first_true(lambda b: value(b) >= tiny, inf_bits), target  # noqa: B023 (called within this iteration)


@pytest.mark.parametrize("source", ["F16", "BF16"])
def test_underflow_tables_are_unchanged(source: str) -> None:
    uint, mask, _inf = stats.IEEE_BITS[source]
    values = every_pattern(source).view(_reference_dtype(source))
    mag = values.view(uint) & uint(mask)
    for target in stats.CAST_TARGETS:
        with np.errstate(all="ignore"):
            back = values.astype(_reference_dtype(target)).astype(values.dtype)
            changed = back != values
            zero = back == 0
        tiny = (mag != 0) & (mag < stats.cast_limits(source, target).normal)
        flushed = tiny & zero
        want = np.zeros(1 << 16, np.uint8)
        want[tiny & changed & ~flushed] = 2
        want[flushed] = 1
        assert np.array_equal(stats.underflow_table(source, target), want), target


def _write_models(folder: Path) -> list[Path]:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(31)
    base = torch.randn(64, 256, generator=gen) * 0.05
    base[0, :8] = torch.tensor([1e-9, -3e-8, 7e5, -7e5, 0.0, -0.0, 448.0, 2e-6])
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8-e4m3": torch.float8_e4m3fn,
              "fp8-e5m2": torch.float8_e5m2, "fp8-e4m3fnuz": torch.float8_e4m3fnuz}
    out = []
    for name, dtype in dtypes.items():
        model = folder / name
        model.mkdir()
        save_file({"model.layers.0.mlp.down_proj.weight": base.to(dtype),
                   "model.norm.weight": torch.ones(256, dtype=dtype)}, str(model / "model.safetensors"))
        out.append(model)
    return out


def _write_block_fp8(folder: Path) -> Path:
    """DeepSeek-style block FP8 (``weight_scale_inv``), cast with no scale (clipped at ±448: CG206) and
    one NaN scale (CG205): the quantized checks' paths, on fp8 and fp32 bits."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(31)
    folder.mkdir()
    save_file({"model.layers.0.mlp.down_proj.weight": (torch.randn(256, 256, generator=gen) * 30000).clamp(
                   -448, 448).to(torch.float8_e4m3fn),
               "model.layers.0.mlp.down_proj.weight_scale_inv": torch.tensor([[1.0, float("nan")], [1.0, 1.0]]),
               "model.norm.weight": torch.ones(256, dtype=torch.bfloat16)},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                "weight_block_size": [128, 128]}}))
    return folder


def test_a_value_scan_never_imports_ml_dtypes(tmp_path: Path) -> None:
    """bf16, fp16 and fp8 files, with casts to fp16, bf16 and fp8 in play, and a block-FP8 set: the scan's
    process never imports ml_dtypes (its import cost more than scanning 1.5 GB), and still gives its figures
    and the quantized checks' findings."""
    models = _write_models(tmp_path)
    block_fp8 = _write_block_fp8(tmp_path / "block-fp8")
    script = (
        "import json, sys\n"
        "from guard.cli import main\n"
        "codes = [main(['scan', '--values', '--format', 'json', '--output', out, *args, model])\n"
        "         for model, out, args in json.loads(sys.argv[1])]\n"
        "print(json.dumps({'codes': codes, 'ml_dtypes': 'ml_dtypes' in sys.modules}))\n")
    runs = []
    for model in models:
        for i, args in enumerate([["--target", "torch:fp16"], ["--target", "jax:bf16"],
                                  ["--target", "torch:float8_e5m2", "--expect", "fp16"]]):
            runs.append([str(model), str(tmp_path / f"{model.name}-{i}.json"), args])
    runs.append([str(block_fp8), str(tmp_path / "block-fp8.json"), []])
    done = subprocess.run([sys.executable, "-c", script, json.dumps(runs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ml_dtypes"] is False
    assert all(code in (0, 1) for code in result["codes"])
    for _model, out, _args in runs[:-1]:
        values = json.loads(Path(out).read_text())["extra"]["values"]
        assert {row["tensor"] for row in values} == {"model.layers.0.mlp.down_proj.weight", "model.norm.weight"}
        assert all("skipped" not in row and row["numel"] > 0 for row in values)
    quantized = json.loads(Path(runs[-1][1]).read_text())["findings"]
    assert {(f["code"], f["tensor"]) for f in quantized if f["code"] in ("CG205", "CG206")} == {
        ("CG205", "model.layers.0.mlp.down_proj.weight_scale_inv"), ("CG206", "model.layers.0.mlp.down_proj.weight")}
