"""Quantized sets judged as what they are: the verdict, the logical size, no fix, and CG110-CG113.

Checkpoints are written by the real libraries (bitsandbytes, hqq, optimum-quanto, compressed-tensors
through ``quant_writers``) or, where no CPU writer exists, to the spec by ``quant_spec_writers``;
the planted defects are edits of those files made afterwards with safetensors.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import quant_writers as qw  # noqa: E402
from scanning import codes, json_scan  # noqa: E402

from guard.cli import main  # noqa: E402

LOGICAL = 361_088  # the tiny Llama's num_parameters() (quant_writers.tiny_llama)

REAL: dict[str, tuple[Callable[..., Path], dict[str, Any], str]] = {
    "bnb-nf4-double-quant": (qw.write_bnb_4bit, {"double_quant": True}, "bitsandbytes"),
    "bnb-fp4-bf16-storage": (qw.write_bnb_4bit, {"quant_type": "fp4", "storage": "bfloat16"}, "bitsandbytes"),
    "bnb-int8": (qw.write_bnb_8bit, {}, "bitsandbytes"),
    "hqq": (qw.write_hqq, {}, "hqq"),
    "quanto-qint4": (qw.write_quanto, {}, "quanto"),
    "quanto-qint8": (qw.write_quanto, {"weights": "qint8"}, "quanto"),
    "compressed-tensors-w4a16": (qw.write_compressed_tensors, {}, "compressed-tensors"),
    "compressed-tensors-nvfp4": (qw.write_compressed_tensors, {"scheme": "NVFP4"}, "compressed-tensors"),
}
SPEC: dict[str, tuple[Callable[..., Path], dict[str, Any], str]] = {
    "gptq-desc-act": (qw.write_gptq, {"desc_act": True}, "gptq"),
    "awq": (qw.write_awq, {}, "awq"),
    "fp8-block": (qw.write_fp8_block, {}, "fp8"),
    "eetq": (qw.write_eetq, {}, "eetq"),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Each checkpoint written once for the module, on first use."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            writer, options, _ = {**REAL, **SPEC}[name]
            cache[name] = writer(tmp_path_factory.mktemp(name) / "m", **options)
        return cache[name]

    return get


@pytest.mark.parametrize("name", [*REAL, *SPEC])
def test_a_quantized_set_passes_under_expect_config_with_its_logical_size(
        name: str, written: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = json_scan(capsys, "--expect", "config", str(written(name)))
    (model,) = report["models"]
    findings = [f for f in report["findings"] if f["code"] != "CG104"]  # bf16 norms: a true note
    if name == "hqq":  # transformers 4.57 stores HQQ's skipped lm_head in fp32: exactly that tensor, truly
        assert ({(f["code"], f["tensor"]) for f in findings}
                <= {("CG101", "lm_head.weight"), ("CG102", "lm_head.weight")})
        assert findings and all(f["fix"]["available"] is False for f in findings)
    else:
        assert rc == 0 and findings == [], findings
    assert model["parameters"] == LOGICAL
    assert model["quantization"]["method"] == {**REAL, **SPEC}[name][2]
    assert model["bits_per_weight"] is not None and 4 <= model["bits_per_weight"] < 16
    assert model["sets"][0]["parameters"] == LOGICAL


def test_the_count_is_the_full_precision_models(written: Callable[[str], Path]) -> None:
    assert qw.twin(qw.write_hqq).num_parameters() == LOGICAL


@pytest.mark.parametrize("name", ["hqq", "bnb-nf4-double-quant"])
def test_fix_plans_no_cast_and_no_config_rewrite(name: str, written: Callable[[str], Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = written(name)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for expect in ("config", "fp32", "fp16"):
        capsys.readouterr()
        main(["fix", "--expect", expect, "--write", "--cast", "--replace", str(folder)])
        out = capsys.readouterr().out
        assert "0 fix(es) planned" in out or "nothing to fix" in out.lower(), out
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    rc, report = json_scan(capsys, "--expect", "fp32", str(folder))
    unfixable = [f for f in report["findings"] if f["code"] in ("CG101", "CG102", "CG103")]
    assert unfixable and all("quantized" in f["fix"]["description"] for f in unfixable)


def test_report_reads_back_the_record_and_an_old_string(written: Callable[[str], Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    main(["scan", "--expect", "config", "--format", "json", "-o", str(out), str(written("quanto-qint4"))])
    capsys.readouterr()
    assert main(["report", str(out), "--format", "text"]) == 0
    text = capsys.readouterr().out
    assert "quantized: quanto qint4 4-bit" in text and "bits per weight" in text and "361.1K" in text
    old = json.loads(out.read_text())
    old["models"][0]["quantization"] = "quanto"  # how reports before the record said it
    old["models"][0].pop("bits_per_weight")
    out.write_text(json.dumps(old))
    assert main(["report", str(out), "--format", "markdown"]) == 0
    assert "quantized: quanto" in capsys.readouterr().out


# ------------------------------------------------------------------ planted defects


def _edit(folder: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """The safetensors file rewritten with ``change`` applied to its tensors (metadata kept)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    (path,) = sorted(folder.glob("*.safetensors"))
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata=metadata)
    return folder


def _config(folder: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


P = "model.layers.0.mlp.down_proj"


def _copy(written: Callable[[str], Path], name: str, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(written(name), tmp_path / name))


def _truncate(key: str) -> Callable[[dict[str, Any]], None]:
    def change(tensors: dict[str, Any]) -> None:
        tensors[key] = tensors[key][: tensors[key].shape[0] // 2].clone()
    return change


def _ignore_lm_head_but_pack_it(config: dict[str, Any]) -> None:
    config["quantization_config"]["ignore"] = ["lm_head", "model.layers.0.mlp.down_proj"]


PLANTS: list[tuple[str, str, Callable[[Path], Path], str, str | None]] = [
    ("gptq missing scales", "gptq-desc-act", lambda f: _edit(f, lambda t: t.pop(f"{P}.scales")), "CG110",
     f"{P}.qweight"),
    ("bnb missing quant_state", "bnb-nf4-double-quant",
     lambda f: _edit(f, lambda t: t.pop(f"{P}.weight.quant_state.bitsandbytes__nf4")), "CG110", f"{P}.weight"),
    ("hqq missing zero", "hqq", lambda f: _edit(f, lambda t: t.pop(f"{P}.zero")), "CG110", f"{P}.W_q"),
    ("truncated gptq payload", "gptq-desc-act", lambda f: _edit(f, _truncate(f"{P}.qweight")), "CG111",
     f"{P}.qweight"),
    ("truncated bnb payload", "bnb-nf4-double-quant", lambda f: _edit(f, _truncate(f"{P}.weight")), "CG111",
     f"{P}.weight"),
    ("corrupt bnb quant_state blob", "bnb-nf4-double-quant",
     lambda f: _edit(f, lambda t: t.__setitem__(f"{P}.weight.quant_state.bitsandbytes__nf4",
                                                t[f"{P}.weight.quant_state.bitsandbytes__nf4"][:0].clone())),
     "CG111", f"{P}.weight"),
    ("config with the wrong bits", "gptq-desc-act",
     lambda f: _config(f, lambda c: c["quantization_config"].update(bits=8)), "CG111", None),
    ("config with the wrong group size", "compressed-tensors-w4a16",
     lambda f: _config(f, lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(
         group_size=32)), "CG111", None),
    ("method the tensors are not packed by", "awq",
     lambda f: _config(f, lambda c: c["quantization_config"].update(quant_method="hqq")), "CG112", None),
    ("packed with no quantization_config", "gptq-desc-act",
     lambda f: _config(f, lambda c: c.pop("quantization_config")), "CG112", None),
    ("a kept-unquantized module that is packed", "compressed-tensors-w4a16",
     lambda f: _config(f, _ignore_lm_head_but_pack_it), "CG113", f"{P}.weight_packed"),
]


@pytest.mark.parametrize("what, name, plant, code, tensor", PLANTS, ids=[p[0] for p in PLANTS])
def test_a_planted_defect_gets_its_code(what: str, name: str, plant: Callable[[Path], Path], code: str,
                                        tensor: str | None, written: Callable[[str], Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = plant(_copy(written, name, tmp_path))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    assert rc == 1 and code in codes(report), report["findings"]
    found = [f for f in report["findings"] if f["code"] == code]
    if tensor is not None:
        assert found[0]["tensor"] == tensor
    assert report["models"][0]["quantization"] is not None


def test_a_declared_method_with_plain_weights_is_cg112(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "m"
    qw.tiny_llama().save_pretrained(folder)  # a dequantized re-save that kept its quantization_config
    _config(folder, lambda c: c.update(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128}))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    assert rc == 1 and codes(report) == {"CG104", "CG112"}
    assert report["models"][0]["parameters"] == LOGICAL


def test_an_unknown_quant_method_is_quantized_with_a_note_never_an_error(
        written: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _config(_copy(written, "awq", tmp_path), lambda c: c["quantization_config"].update(quant_method="vptq"))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    assert rc == 0 and codes(report) <= {"CG104"}
    assert report["models"][0]["quantization"]["method"] == "vptq"
    assert report["models"][0]["quantization"]["known"] is False
    capsys.readouterr()
    main(["scan", str(folder)])
    assert "method not recognised" in capsys.readouterr().out


def test_an_attacker_named_tensor_stays_inert(written: Callable[[str], Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "model.layers.0.mlp.\x1b[31m::error::x\n"

    def rename(tensors: dict[str, Any]) -> None:
        tensors[hostile + ".qweight"] = tensors.pop(f"{P}.qweight")  # a payload whose scales are elsewhere

    folder = _edit(_copy(written, "gptq-desc-act", tmp_path), rename)
    capsys.readouterr()
    assert main(["scan", "--expect", "config", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "CG110" in out and "\x1b" not in out and "\n::error::" not in out


# ------------------------------------------------------------------ declarations beside config.json


def test_an_old_autogptq_quantize_config_json_declares_the_method(
        written: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(written, "gptq-desc-act", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "quantize_config.json").write_text(json.dumps(config.pop("quantization_config")))
    (folder / "config.json").write_text(json.dumps(config))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    assert rc == 0 and codes(report) <= {"CG104"}, report["findings"]
    quantization = report["models"][0]["quantization"]
    assert quantization["method"] == "gptq" and quantization["declared_by"] == "quantize_config.json"
    assert report["models"][0]["parameters"] == LOGICAL


def test_quanto_is_declared_by_its_qmap(written: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = json_scan(capsys, "--expect", "config", str(written("quanto-qint4")))
    quantization = report["models"][0]["quantization"]
    assert quantization["declared_by"] == "quanto_qmap.json" and quantization["bits"] == 4


def _mlx_layout(folder: Path, *, bits: int = 4, group: int = 64) -> Path:
    """mlx-lm's 4-bit affine layout (quant_mlx's docstring: U32 weights, scales and biases for every Linear,
    the embeddings and lm_head; a single shard with its index; ``quantization`` and its copy in config.json)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    tensors: dict[str, Any] = {"model.norm.weight": np.ones(128, np.float16)}
    shapes = {"model.embed_tokens": (256, 128), "lm_head": (256, 128), f"{P}": (128, 256),
              "model.layers.0.mlp.up_proj": (256, 128)}
    for prefix, (rows, cols) in shapes.items():
        tensors[prefix + ".weight"] = np.zeros((rows, cols * bits // 32), np.uint32)
        tensors[prefix + ".scales"] = np.ones((rows, cols // group), np.float16)
        tensors[prefix + ".biases"] = np.zeros((rows, cols // group), np.float16)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "mlx"})
    index = {"metadata": {"total_size": 0}, "weight_map": {name: "model.safetensors" for name in sorted(tensors)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    record = {"group_size": group, "bits": bits, "mode": "affine"}
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float16",
                                                    "quantization": record, "quantization_config": record}))
    return folder


def test_mlx_single_shard_index_is_no_cg004_and_its_record_is_read(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = json_scan(capsys, "--expect", "config", str(_mlx_layout(tmp_path / "m")))
    assert rc == 0 and codes(report) <= {"CG104"}, report["findings"]
    (model,) = report["models"]
    assert [s["name"] for s in model["sets"]] == ["model.safetensors"]
    assert model["quantization"]["method"] == "mlx" and model["quantization"]["bits"] == 4
    assert model["parameters"] == 3 * 256 * 128 + 128 * 256 + 128
    assert model["bits_per_weight"] == pytest.approx(4.5, abs=0.05)  # 4 + 2 × 16 bits per group of 64
    capsys.readouterr()
    main(["scan", str(tmp_path / "m")])
    assert "quantized: mlx affine 4-bit g64" in capsys.readouterr().out


def test_mlx_with_the_wrong_bits_in_its_config_is_cg111(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _mlx_layout(tmp_path / "m")
    _config(folder, lambda c: c.update(quantization={"group_size": 64, "bits": 8, "mode": "affine"}))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    assert rc == 1 and "CG111" in codes(report)


def test_a_sparse_24_bitmask_set_counts_its_logical_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """compressed-tensors' Sparse24BitMaskCompressor layout (to the spec: 0.20 removed the sparse compressors):
    ``P.weight.compressed`` holds the kept half, ``P.weight.bitmask`` one bit a logical value."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "m"
    folder.mkdir()
    tensors: dict[str, Any] = {"model.embed_tokens.weight": np.zeros((256, 128), ml_dtypes.bfloat16)}
    for prefix, (rows, cols) in {f"{P}": (128, 256), "model.layers.0.mlp.up_proj": (256, 128)}.items():
        tensors[prefix + ".weight.compressed"] = np.zeros((rows, cols // 2), ml_dtypes.float8_e4m3fn)
        tensors[prefix + ".weight.bitmask"] = np.zeros((rows, cols // 8), np.uint8)
        tensors[prefix + ".weight.shape"] = np.array([rows, cols], np.int64)
        tensors[prefix + ".weight_scale"] = np.ones((rows, 1), ml_dtypes.bfloat16)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16", "quantization_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}},
        "sparsity_config": {"format": "sparse-24-bitmask", "sparsity_structure": "2:4"}}}))
    rc, report = json_scan(capsys, "--expect", "config", "--target", "flax", str(folder))
    assert rc == 0 and report["findings"] == [], report["findings"]
    assert report["models"][0]["parameters"] == 3 * 256 * 128


def test_a_torchao_pickle_is_counted_and_gets_no_safetensors_copy(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = qw.write_torchao(tmp_path / "m")  # Int8WeightOnly: tensor subclasses in pytorch_model.bin
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    assert report["models"][0]["parameters"] == LOGICAL
    assert report["models"][0]["quantization"]["method"] == "torchao"
    assert codes(report, severity="error") == set(), report["findings"]
    capsys.readouterr()
    main(["fix", "--expect", "config", "--write", str(folder)])
    assert "torchao tensor subclasses" in capsys.readouterr().out
    assert not (folder / "model.safetensors").exists()
