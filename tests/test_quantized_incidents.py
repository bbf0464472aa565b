"""Quantization configs against the tensors, as each loader resolves them (issue 47, item 2): the published
incidents, each written by its own library (or to its spec) and damaged the way the published one was, and
a healthy twin of each that gives no finding.

- compressed-tensors (llm-compressor#2641, vllm#52501): written by compressed-tensors' own API
  (``quant_writers.write_compressed_tensors``) with the modules it keeps unquantized, then its ``ignore`` list
  renamed the way a later transformers renamed the modules (``language_model.lm_head`` for ``lm_head``).
  The oracles: compressed-tensors' own ``match_named_modules`` on the model, and transformers' loading info.
- ModelOpt (vllm#54189, vllm#45212): nvidia-modelopt 0.47 installs on the CPU as a wheel but quantizes
  through its CUDA fake-quant kernels, so the set is written to its export spec by
  ``quant_spec_writers.write_modelopt`` (tensors as ModelOptNvfp4Converter reads them back); the
  ``quantization_config`` with ``config_groups`` is what modelopt 0.47's
  ``torch/export/convert_hf_config.py`` ``convert_hf_quant_config_format`` writes for NVFP4, with
  ``input_activations`` null as in the incident.
- GPTQ (vllm#38966): no GPTQ library quantizes on the CPU here (gptqmodel and auto-gptq build CUDA kernels),
  so the sets are written to the spec by ``quant_spec_writers.write_gptq``: AutoGPTQ's v1 stores each zero
  point minus one, gptqmodel's v2 stores it as is (gptqmodel ``utils/model.py`` ``convert_gptq_v1_to_v2_format``
  adds the one back; vLLM's ``gptq`` reader does the same for ``checkpoint_format`` gptq only).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import quant_writers as qw  # noqa: E402
from scanning import codes, json_scan  # noqa: E402

KEPT = ("lm_head", "model.layers.0.mlp.down_proj")  # kept unquantized when the set was written
RENAMED = ["language_model.lm_head", "language_model.model.layers.0.mlp.down_proj"]  # the names before a rename


def _edit(folder: Path, change: Callable[[dict[str, Any]], None]) -> Path:
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


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Each set written once for the module; a test gets a copy to damage."""
    cache: dict[str, Path] = {}

    def get(name: str, tmp_path: Path) -> Path:
        if name not in cache:
            out = tmp_path_factory.mktemp(name) / "m"
            if name.startswith("ct-"):
                qw.write_compressed_tensors(out, scheme=name[3:], ignore=KEPT)
            elif name == "modelopt-nvfp4":
                qw.write_modelopt(out, algo="NVFP4")
            elif name == "modelopt-fp8":
                qw.write_modelopt(out, algo="FP8")
            else:
                qw.write_gptq(out, checkpoint_format=name)
            cache[name] = out
        return Path(shutil.copytree(cache[name], tmp_path / name))

    return get


def _findings(report: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"] == code]


# ------------------------------------------------------------------ compressed-tensors


def _targeted_without_scales(folder: Path) -> set[str]:
    """What compressed-tensors itself selects on the model (``match_named_modules`` with the config's targets and
    ignore) that have a weight, less those stored with a weight_scale: loaded as quantized, with no scales."""
    from compressed_tensors.utils.match import match_named_modules

    qc = qw.quantization_config(folder)
    targets = [t for group in qc["config_groups"].values() for t in group["targets"]]
    stored = qw.safetensors_listing(folder)
    return {name for name, module in match_named_modules(qw.tiny_llama(), targets, qc["ignore"])
            if hasattr(module, "weight") and f"{name}.weight_scale" not in stored}  # act_fn matches, has no weight


@pytest.mark.parametrize("scheme", ["FP8", "NVFP4"])
def test_an_ignore_list_that_no_longer_matches_names_every_unscaled_target(
        scheme: str, written: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _config(written(f"ct-{scheme}", tmp_path),
                     lambda c: c["quantization_config"].update(ignore=RENAMED))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    (found,) = _findings(report, "CG110")
    assert rc == 1 and found["severity"] == "error" and found["tensor"] == "lm_head.weight"
    assert _targeted_without_scales(folder) == set(KEPT)  # compressed-tensors' own resolution
    for module in KEPT:
        assert repr(module) in found["message"]
    assert "'lm_head.weight_scale' missing" in found["message"] and "language_model.lm_head" in found["message"]
    assert "CG113" not in codes(report)  # the same modules, named once (the old sibling finding named one)


def test_transformers_reports_the_same_scales_missing(written: Callable[..., Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' loading info for the damaged FP8 set: the weight_scale of each module the finding names."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = _config(written("ct-FP8", tmp_path), lambda c: c["quantization_config"].update(ignore=RENAMED))
    _, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, device_map="cpu",
                                                    dtype=torch.bfloat16)
    missing = {k.removesuffix(".weight_scale") for k in info["missing_keys"] if k.endswith(".weight_scale")}
    _, report = json_scan(capsys, "--expect", "config", str(folder))
    (found,) = _findings(report, "CG110")
    assert missing == set(KEPT) and all(repr(m) in found["message"] for m in missing)


@pytest.mark.parametrize("ignore", [None, ["re:.*lm_head$", r"re:model\.layers\.0\.mlp\.down_proj$"]],
                         ids=["as-written", "regex"])
@pytest.mark.parametrize("scheme", ["FP8", "NVFP4"])
def test_the_healthy_twin_gives_no_finding(scheme: str, ignore: list[str] | None, written: Callable[..., Path],
                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = written(f"ct-{scheme}", tmp_path)
    if ignore is not None:
        _config(folder, lambda c: c["quantization_config"].update(ignore=ignore))
    assert _targeted_without_scales(folder) == set()
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    assert rc == 0 and not codes(report) & {"CG110", "CG111", "CG112", "CG113"}, report["findings"]


def test_a_regex_that_no_longer_matches_is_resolved_as_compressed_tensors_does(
        written: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``re:`` is ``re.match`` from the start of the name: ``re:lm_head`` matched, ``re:language_model.*`` not."""
    folder = _config(written("ct-FP8", tmp_path), lambda c: c["quantization_config"].update(
        ignore=["re:language_model\\..*lm_head", "re:model\\.layers\\.0\\.mlp\\.down_proj"]))
    assert _targeted_without_scales(folder) == {"lm_head"}
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    (found,) = _findings(report, "CG110")
    assert found["tensor"] == "lm_head.weight" and "1 Linear module(s)" in found["message"]


def test_targets_that_name_modules_select_only_those(written: Callable[..., Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A group that targets by name (``re:.*mlp\\..*``): attention and lm_head are not targeted, so stored
    plain they are no finding; an MLP stored plain is."""
    folder = _config(written("ct-FP8", tmp_path), lambda c: c["quantization_config"].update(ignore=[]) or
                     c["quantization_config"]["config_groups"]["group_0"].update(targets=["re:.*mlp\\..*"]))
    assert _targeted_without_scales(folder) == {"model.layers.0.mlp.down_proj"}
    _, report = json_scan(capsys, "--expect", "config", str(folder))
    (found,) = _findings(report, "CG110")
    assert found["tensor"] == "model.layers.0.mlp.down_proj.weight" and "lm_head" not in found["message"]


# ------------------------------------------------------------------ ModelOpt


def _weight_only_groups(config: dict[str, Any]) -> None:
    """modelopt 0.47's convert_hf_quant_config_format for NVFP4, with input_activations null (vllm#54189)."""
    qc = config["quantization_config"]
    qc["config_groups"] = {"group_0": {
        "input_activations": None, "targets": ["Linear"],
        "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}}}
    qc["ignore"] = qc.pop("exclude_modules")


def _drop(suffix: str) -> Callable[[dict[str, Any]], None]:
    def change(tensors: dict[str, Any]) -> None:
        for name in [n for n in tensors if n.endswith(suffix)]:
            del tensors[name]
    return change


@pytest.mark.parametrize("where", ["config.json", "hf_quant_config.json"])
def test_modelopt_nvfp4_without_input_scales_is_an_error_naming_what_reads_as_zero(
        where: str, written: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _edit(written("modelopt-nvfp4", tmp_path), _drop(".input_scale"))
    if where == "hf_quant_config.json":  # the older export: config.json says nothing, vLLM reads the file beside it
        _config(folder, lambda c: c.pop("quantization_config"))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    (found,) = _findings(report, "CG110")
    assert rc == 1 and found["tensor"] == "model.layers.0.mlp.down_proj.weight"
    assert "'model.layers.0.mlp.down_proj.input_scale' as 0" in found["message"] and where in found["message"]
    assert "CG129" not in codes(report)


def test_modelopt_nvfp4_without_weight_scale_2_names_it(written: Callable[..., Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = _edit(written("modelopt-nvfp4", tmp_path), _drop(".weight_scale_2"))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    (found,) = _findings(report, "CG110")
    assert "'model.layers.0.mlp.down_proj.weight_scale_2' as 0" in found["message"]


def test_a_weight_only_nvfp4_set_is_a_note_never_an_error(written: Callable[..., Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    folder = _config(_edit(written("modelopt-nvfp4", tmp_path), _drop(".input_scale")), _weight_only_groups)
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    assert rc == 0 and codes(report, severity="error") == set(), report["findings"]
    (note,) = _findings(report, "CG129")
    assert note["severity"] == "note" and note["path"].endswith("config.json")
    assert "vllm#54189" in note["message"] and "#54427" in note["message"] and "input_activations null" in \
        note["message"]


@pytest.mark.parametrize("algo", ["modelopt-nvfp4", "modelopt-fp8"])
def test_the_healthy_modelopt_twin_gives_no_finding(algo: str, written: Callable[..., Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = json_scan(capsys, "--expect", "config", str(written(algo, tmp_path)))
    assert rc == 0 and not codes(report) & {"CG110", "CG111", "CG112", "CG113", "CG129"}, report["findings"]


def test_modelopt_fp8_without_input_scales_is_an_error(written: Callable[..., Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    folder = _edit(written("modelopt-fp8", tmp_path), _drop(".input_scale"))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    (found,) = _findings(report, "CG110")
    assert rc == 1 and "modelopt-fp8" in found["message"] and "input_scale' as 0" in found["message"]


# ------------------------------------------------------------------ GPTQ


def _zero_nibbles(folder: Path) -> set[int]:
    from safetensors.torch import load_file

    qzeros = load_file(str(folder / "model.safetensors"))["model.layers.0.mlp.down_proj.qzeros"]
    return {int(v) for shift in range(0, 32, 4) for v in ((qzeros.long() >> shift) & 0xF).unique()}


@pytest.mark.parametrize("stored, declared", [("gptq_v2", "gptq"), ("gptq", "gptq_v2")])
def test_gptq_zero_points_of_the_other_format_are_cg208(stored: str, declared: str, written: Callable[..., Path],
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _config(written(stored, tmp_path),
                     lambda c: c["quantization_config"].update(checkpoint_format=declared))
    assert _zero_nibbles(folder) == ({8} if stored == "gptq_v2" else {7})  # symmetric 4-bit, as written
    rc, report = json_scan(capsys, "--expect", "config", "--values", str(folder))
    (found,) = _findings(report, "CG208")
    assert rc == 1 and found["severity"] == "error" and found["tensor"].endswith(".qzeros")
    assert f"checkpoint_format '{declared}'" in found["message"] and f"Declare checkpoint_format {stored}" in \
        found["message"]
    _, headers_only = json_scan(capsys, "--expect", "config", str(folder))
    assert "CG208" not in codes(headers_only)  # values, not headers: the scan reads no tensor data by default


@pytest.mark.parametrize("name", ["gptq", "gptq_v2"])
def test_gptq_zero_points_of_the_declared_format_give_no_finding(name: str, written: Callable[..., Path],
                                                                 tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = json_scan(capsys, "--expect", "config", "--values", str(written(name, tmp_path)))
    assert rc == 0 and "CG208" not in codes(report), report["findings"]


def test_asymmetric_gptq_zero_points_say_nothing_of_the_format(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder = qw.write_gptq(tmp_path / "m", sym=False, checkpoint_format="gptq")
    _config(folder, lambda c: c["quantization_config"].update(checkpoint_format="gptq_v2"))
    _, report = json_scan(capsys, "--expect", "config", "--values", str(folder))
    assert "CG208" not in codes(report)


# ------------------------------------------------------------------ hostile configs and names


def test_a_hostile_config_and_tensor_name_stay_inert(written: Callable[..., Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A pattern that does not compile, entries that are not strings, a group without targets: no traceback;
    a targeted Linear with terminal escapes in its name is named escaped."""
    import torch

    evil = "model.layers.0.mlp.x\x1b[2J\x1b]8;;http://e\x07"
    plain = torch.zeros(4, 8, dtype=torch.bfloat16)
    folder = _edit(written("ct-FP8", tmp_path), lambda t: t.__setitem__(evil + ".weight", plain))
    _config(folder, lambda c: c["quantization_config"].update(
        ignore=["re:(", 7, None, *KEPT], config_groups={**c["quantization_config"]["config_groups"],
                                                     "odd": {"weights": {"num_bits": 8}, "targets": "Linear"},
                                                     "none": None}))
    rc, report = json_scan(capsys, "--expect", "config", str(folder))
    (found,) = _findings(report, "CG110")
    assert rc == 1 and found["tensor"] == evil + ".weight" and "\x1b" not in found["message"]
    assert "'re:('" not in found["message"]  # it matches no module, and is not reported as a stale name either


def test_gpt2s_conv1d_projections_are_no_linear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GPT-2's c_attn, c_proj and c_fc are transformers' Conv1D, with 2-D weights: compressed-tensors'
    ``Linear`` selects none of them, so stored plain they are no CG110."""
    from compressed_tensors.utils.match import match_named_modules
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    model.save_pretrained(tmp_path / "m")
    qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}}
    _config(tmp_path / "m", lambda c: c.update(quantization_config=qc))
    assert [n for n, _ in match_named_modules(model, ["Linear"], ["lm_head"])] == []
    _, report = json_scan(capsys, "--expect", "config", str(tmp_path / "m"))
    assert "CG110" not in codes(report), report["findings"]
