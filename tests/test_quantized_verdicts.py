"""The expert's verdict on every quantized layout, through the CLI, on checkpoints written by the real
libraries (or to spec where none runs on CPU: tests/quant_spec_writers.py): ``scan --expect config``
finds nothing the unquantized twin would not, ``parameters`` is the twin's ``num_parameters()``,
``fix`` plans nothing and writes nothing, ``convert --to flax`` refuses in one line naming the method
and --dequantize. Planted defects on the same output get CG110/CG111/CG112/CG205, and
``convert --dequantize`` refuses to write them."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_writers as qw  # noqa: E402
from scanning import json_scan, tree_state  # noqa: E402

from guard.cli import main  # noqa: E402

pytestmark = pytest.mark.slow

LM_HEAD_FP32 = frozenset({("CG101", "lm_head.weight"), ("CG102", "lm_head.weight")})
# id -> (writer, options, the method the report names, true findings: (code, tensor))
CASES: dict[str, tuple[Callable[..., Path], dict[str, Any], str, frozenset[tuple[str, str]]]] = {
    "bnb-nf4": (qw.write_bnb_4bit, {}, "bitsandbytes", frozenset()),
    "bnb-nf4-double-quant": (qw.write_bnb_4bit, {"double_quant": True}, "bitsandbytes", frozenset()),
    "bnb-fp4": (qw.write_bnb_4bit, {"quant_type": "fp4"}, "bitsandbytes", frozenset()),
    "bnb-nf4-bf16-storage": (qw.write_bnb_4bit, {"double_quant": True, "storage": "bfloat16"}, "bitsandbytes",
                             frozenset()),
    "bnb-fp4-f32-storage": (qw.write_bnb_4bit, {"quant_type": "fp4", "storage": "float32"}, "bitsandbytes",
                            frozenset()),
    "bnb-8bit": (qw.write_bnb_8bit, {}, "bitsandbytes", frozenset()),
    # transformers 4.57 stores HQQ's skipped lm_head in fp32 under a bf16 config: a true finding
    "hqq": (qw.write_hqq, {}, "hqq", LM_HEAD_FP32),
    "hqq-2bit": (qw.write_hqq, {"nbits": 2}, "hqq", LM_HEAD_FP32),
    "hqq-3bit": (qw.write_hqq, {"nbits": 3}, "hqq", LM_HEAD_FP32),  # W_q I32 [52, 64]: 10 values an int32
    "hqq-8bit": (qw.write_hqq, {"nbits": 8}, "hqq", LM_HEAD_FP32),
    "quanto-int2": (qw.write_quanto, {"weights": "qint2"}, "quanto", frozenset()),
    "quanto-int4": (qw.write_quanto, {"weights": "qint4"}, "quanto", frozenset()),
    "quanto-int8": (qw.write_quanto, {"weights": "qint8"}, "quanto", frozenset()),
    "quanto-float8": (qw.write_quanto, {"weights": "qfloat8"}, "quanto", frozenset()),
    # torchao's int8 subclasses cannot be saved as safetensors: the pickle-only note is true (its fix is not)
    "torchao-int8": (qw.write_torchao, {"kind": "int8"}, "torchao", frozenset({("CG008", None)})),
    "torchao-int8-dynamic": (qw.write_torchao, {"kind": "int8-dynamic"}, "torchao", frozenset({("CG008", None)})),
    "torchao-intx": (qw.write_torchao, {"kind": "intx"}, "torchao", frozenset({("CG008", None)})),
    "torchao-float8": (qw.write_torchao, {"kind": "float8"}, "torchao", frozenset()),
    "torchao-float8-bin": (qw.write_torchao, {"kind": "float8-bin"}, "torchao", frozenset({("CG008", None)})),
    "ct-w4a16": (qw.write_compressed_tensors, {"scheme": "W4A16"}, "compressed-tensors", frozenset()),
    "ct-w4a16-asym": (qw.write_compressed_tensors, {"scheme": "W4A16_ASYM"}, "compressed-tensors", frozenset()),
    "ct-w8a16": (qw.write_compressed_tensors, {"scheme": "W8A16"}, "compressed-tensors", frozenset()),
    "ct-naive": (qw.write_compressed_tensors, {"scheme": "W4A16", "format": "naive-quantized"},
                 "compressed-tensors", frozenset()),
    "ct-fp8": (qw.write_compressed_tensors, {"scheme": "FP8"}, "compressed-tensors", frozenset()),
    "ct-fp8-block": (qw.write_compressed_tensors, {"scheme": "FP8_BLOCK"}, "compressed-tensors", frozenset()),
    "ct-w8a8": (qw.write_compressed_tensors, {"scheme": "W8A8"}, "compressed-tensors", frozenset()),
    "ct-nvfp4": (qw.write_compressed_tensors, {"scheme": "NVFP4"}, "compressed-tensors", frozenset()),
    "gptq": (qw.write_gptq, {}, "gptq", frozenset()),
    "gptq-desc-act-asym": (qw.write_gptq, {"desc_act": True, "sym": False}, "gptq", frozenset()),
    "gptq-v2": (qw.write_gptq, {"checkpoint_format": "gptq_v2"}, "gptq", frozenset()),
    "gptq-8bit-g64": (qw.write_gptq, {"bits": 8, "group_size": 64}, "gptq", frozenset()),
    "gptq-2bit-per-column": (qw.write_gptq, {"bits": 2, "group_size": -1}, "gptq", frozenset()),
    "gptq-quantize-config": (qw.write_gptq, {"legacy_config": True}, "gptq", frozenset()),
    "awq": (qw.write_awq, {}, "awq", frozenset()),
    "awq-g64": (qw.write_awq, {"group_size": 64}, "awq", frozenset()),
    "fp8-block": (qw.write_fp8_block, {}, "fp8", frozenset()),
    "fbgemm-fp8": (qw.write_fbgemm_fp8, {}, "fbgemm_fp8", frozenset()),
    "modelopt-fp8": (qw.write_modelopt, {"algo": "FP8"}, "modelopt", frozenset()),
    "modelopt-nvfp4": (qw.write_modelopt, {"algo": "NVFP4"}, "modelopt", frozenset()),
    "mxfp4": (qw.write_mxfp4, {}, "mxfp4", frozenset()),
    "eetq": (qw.write_eetq, {}, "eetq", frozenset()),
    "bitnet": (qw.write_bitnet, {}, "bitnet", frozenset()),
    "mlx-4bit": (qw.write_mlx, {"bits": 4}, "mlx", frozenset()),
    "mlx-8bit": (qw.write_mlx, {"bits": 8}, "mlx", frozenset()),
    "mlx-mxfp4": (qw.write_mlx, {"bits": 4, "group_size": 32, "mode": "mxfp4"}, "mlx", frozenset()),
    "mlx-nvfp4": (qw.write_mlx, {"bits": 4, "group_size": 16, "mode": "nvfp4"}, "mlx", frozenset()),
    "mlx-mxfp8": (qw.write_mlx, {"bits": 8, "group_size": 32, "mode": "mxfp8"}, "mlx", frozenset()),
}

_BUILT: dict[str, Path] = {}
_TWIN_CODES: dict[str, set[str]] = {}


def written(case: str, factory: pytest.TempPathFactory) -> Path:
    """Each case is written once per session; tests that change it work on a copy."""
    if case not in _BUILT:
        writer, options, _, _ = CASES[case]
        try:
            _BUILT[case] = writer(factory.mktemp(case) / "model", **options)
        except qw.MlxUnavailable as exc:
            pytest.skip(str(exc))
    return _BUILT[case]


def twin_codes(writer: Callable[..., Path], factory: pytest.TempPathFactory, capsys: Any) -> set[str]:
    """The codes the unquantized twin itself gets (bf16 norms are a note on any Llama)."""
    kind = "gpt-oss" if writer is qw.write_mxfp4 else "llama"
    if kind not in _TWIN_CODES:
        folder = factory.mktemp(f"twin-{kind}")
        qw.twin(writer).save_pretrained(folder)
        _TWIN_CODES[kind] = {f["code"] for f in json_scan(capsys, str(folder), "--expect", "config")[1]["findings"]}
    return _TWIN_CODES[kind]


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return request.param, written(request.param, tmp_path_factory)


@pytest.mark.parametrize("values", [False, True], ids=["headers", "values"])
def test_scan_expect_config_finds_nothing_false(case: tuple[str, Path], values: bool,
                                                tmp_path_factory: pytest.TempPathFactory,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """--values too: healthy scales are no CG205, and amax-scaled FP8 (one element per block at 448)
    is no CG206."""
    name, folder = case
    writer, _, method, true_findings = CASES[name]
    allowed = twin_codes(writer, tmp_path_factory, capsys)
    code, report = json_scan(capsys, str(folder), "--expect", "config", *(["--values"] if values else []))
    false = [f for f in report["findings"]
             if f["code"] not in allowed and (f["code"], f.get("tensor")) not in true_findings]
    assert false == [], [(f["code"], f.get("tensor"), f["message"][:160]) for f in false]
    has_true_error = any(f["severity"] == "error" for f in report["findings"])
    assert code == (1 if has_true_error else 0)
    (model,) = report["models"]
    assert (model.get("quantization") or {}).get("method") == method


def test_parameters_are_the_unquantized_models(case: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    name, folder = case
    logical = qw.twin(CASES[name][0]).num_parameters()
    _, report = json_scan(capsys, str(folder))
    (model,) = report["models"]
    assert model["parameters"] == logical
    assert [s["parameters"] for s in model["sets"] if s["role"] == "weights"] == [logical]


@pytest.mark.parametrize("name", ["mlx-4bit", "mlx-8bit", "mlx-mxfp4", "mlx-nvfp4", "mlx-mxfp8"])
def test_bits_per_weight_is_what_mlx_lm_prints(name: str, tmp_path_factory: pytest.TempPathFactory,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from quant_mlx import REPORTED_BITS_PER_WEIGHT

    folder = written(name, tmp_path_factory)
    _, report = json_scan(capsys, str(folder))
    assert report["models"][0]["bits_per_weight"] == pytest.approx(REPORTED_BITS_PER_WEIGHT[folder], abs=0.01)


def test_fix_plans_nothing_and_writes_nothing(case: tuple[str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Even asked to --write with --cast: a quantized set has no mechanical dtype fix."""
    folder = shutil.copytree(case[1], tmp_path / "model")
    before = tree_state(folder)
    capsys.readouterr()
    main(["fix", str(folder), "--expect", "config", "--format", "json"])
    fix = json.loads(capsys.readouterr().out)["extra"]["fix"]
    assert fix["plan"] == [] and fix["written"] is False
    main(["fix", str(folder), "--expect", "config", "--cast", "--write", "--format", "json"])
    assert tree_state(folder) == before


def test_convert_to_flax_refuses_in_one_line(case: tuple[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    name, folder = case
    out = tmp_path / "flax"
    capsys.readouterr()
    assert main(["convert", str(folder), "--to", "flax", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert CASES[name][2] in err and "--dequantize" in err
    assert not out.exists() or not any(out.iterdir())


# planted defects: (case, plant, the codes that name it, needs --values)
PLANTS: list[tuple[str, Callable[[Path], str], tuple[str, ...], bool]] = [
    ("gptq", qw.plant_missing_scale, ("CG110",), False),
    ("awq", qw.plant_missing_scale, ("CG110",), False),
    ("bnb-nf4", qw.plant_missing_scale, ("CG110",), False),
    ("bnb-8bit", qw.plant_missing_scale, ("CG110",), False),
    ("hqq", qw.plant_missing_scale, ("CG110",), False),
    ("ct-w4a16", qw.plant_missing_scale, ("CG110",), False),
    ("fp8-block", qw.plant_missing_scale, ("CG110",), False),
    ("mxfp4", qw.plant_missing_scale, ("CG110",), False),
    ("mlx-4bit", qw.plant_missing_scale, ("CG110",), False),
    ("gptq", qw.plant_truncated_payload, ("CG111",), False),
    ("bnb-nf4", qw.plant_truncated_payload, ("CG111",), False),
    ("ct-w4a16", qw.plant_truncated_payload, ("CG111",), False),
    ("hqq", qw.plant_truncated_payload, ("CG111",), False),
    ("mlx-4bit", qw.plant_truncated_payload, ("CG111",), False),
    ("gptq", qw.plant_wrong_bits, ("CG111",), False),
    ("awq", qw.plant_wrong_bits, ("CG111",), False),
    ("ct-w4a16", qw.plant_wrong_bits, ("CG111",), False),
    ("mlx-4bit", qw.plant_wrong_bits, ("CG111",), False),
    ("hqq", qw.plant_wrong_bits, ("CG111",), False),
    ("bnb-nf4", qw.plant_wrong_bits, ("CG111", "CG112"), False),  # 4-bit payloads under an 8-bit config
    # an unreadable quant_state is a component lost (CG110) or a logical shape unknown (CG111); the blob is
    # data, so it is read with --values (a header scan sees a U8 [169] tensor, as it should)
    ("bnb-nf4", qw.plant_corrupt_quant_state, ("CG110", "CG111"), True),
    ("bnb-8bit", qw.plant_nan_scales, ("CG205",), True),
    ("gptq", qw.plant_nan_scales, ("CG205",), True),
    ("fp8-block", qw.plant_nan_scales, ("CG205",), True),
    ("ct-nvfp4", qw.plant_nan_scales, ("CG205",), True),
    ("mxfp4", qw.plant_nan_scales, ("CG205",), True),
    ("mlx-mxfp4", qw.plant_nan_scales, ("CG205",), True),
]


@pytest.mark.parametrize(("name", "plant", "expected", "values"), PLANTS,
                         ids=[f"{n}-{p.__name__.removeprefix('plant_')}" for n, p, _, _ in PLANTS])
def test_planted_defect_gets_its_code(name: str, plant: Callable[[Path], str], expected: tuple[str, ...],
                                      values: bool, tmp_path_factory: pytest.TempPathFactory,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    folder = shutil.copytree(written(name, tmp_path_factory), tmp_path_factory.mktemp("planted") / "model")
    broken = plant(folder)
    code, report = json_scan(capsys, str(folder), "--expect", "config", *(["--values"] if values else []))
    assert code == 1
    hits = [f for f in report["findings"] if f["code"] in expected]
    assert hits, (broken, [(f["code"], f.get("tensor")) for f in report["findings"]])
    if broken.startswith("model."):  # a tensor (not a config key): the finding names its module
        module = ".".join(broken.split(".")[:5])
        assert any(module in (f.get("tensor") or "") + f["message"] for f in hits), (broken, hits)
    out = tmp_path_factory.mktemp("dequantized") / "out"
    assert main(["convert", str(folder), "--to", "torch", "--dequantize", "--out", str(out)]) != 0
    assert not out.exists() or not any(out.iterdir())  # a broken quantized set is never dequantized into garbage
