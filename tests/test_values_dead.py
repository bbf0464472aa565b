"""CG207 (dead weights): matrices of one value, found by ``scan --values``, ``diff --values`` and the upload gate.

The incident: microsoft/BitNet#608, where every MLP weight of bitnet-b1.58-2B-4T was zero and every
re-upload inherited them.  Each model here is written by transformers' ``save_pretrained`` (PEFT's
``save_pretrained`` for the adapter) and damaged as the published one was, before it was saved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from guard.cli import main  # noqa: E402
from guard.values.dead import _ranges, grouped_findings  # noqa: E402

SIZES: dict[str, Any] = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
                         "tie_word_embeddings": False}


def llama(out: Path, damage: Any = None, *, dtype: str = "bfloat16", **config: Any) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**SIZES, **config})).to(getattr(torch, dtype))
    if damage is not None:
        with torch.no_grad():
            damage(model)
    model.save_pretrained(out)
    return out


def zero_mlp(model: Any) -> None:  # what BitNet's re-uploads carried
    for layer in model.model.layers:
        for proj in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            proj.weight.zero_()


def scan(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, Any]]:
    capsys.readouterr()  # what writing the model printed (DeepSpeed's accelerator line, through transformers)
    code = main(["scan", "--values", "--fail-on", "warning", "--format", "json", *extra, str(path)])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert code == (1 if any(f["severity"] in ("error", "warning") for f in findings) else 0)
    return findings


def dead(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f["code"] == "CG207"]


def test_zeroed_mlp_weights_are_one_warning_naming_the_layers(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    found = dead(scan(llama(tmp_path / "m", zero_mlp), capsys))
    assert len(found) == 1, found
    (finding,) = found
    assert finding["severity"] == "warning"
    assert finding["message"].startswith("the mlp weights of layers 0–3 are all zero: ")
    assert "model.layers.[0–3].mlp.{down_proj,gate_proj,up_proj}.weight" in finding["message"]
    assert "(12 bf16 matrices)" in finding["message"]
    assert finding["tensor"].startswith("model.layers.0.mlp.")


def test_the_healthy_twin_has_no_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dead(scan(llama(tmp_path / "m"), capsys)) == []


def test_zero_biases_and_norms_are_not_dead(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """attention_bias=True: transformers zero-initialises every bias; norms are ones (vectors)."""
    def zero_biases(model: Any) -> None:
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.zero_()

    path = llama(tmp_path / "m", zero_biases, attention_bias=True, mlp_bias=True)
    names = json.loads((path / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (path / "model.safetensors").read_bytes()[:8], "little")])
    assert "model.layers.0.mlp.down_proj.bias" in names  # the case is real: zero biases are stored
    assert dead(scan(path, capsys)) == []


def test_a_constant_matrix_is_dead_with_its_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = llama(tmp_path / "m", lambda m: m.model.layers[2].self_attn.o_proj.weight.fill_(0.5), dtype="float32")
    (finding,) = dead(scan(path, capsys))
    assert finding["message"] == ("the self_attn weights of layer 2 are constant (0.5): "
                                  "'model.layers.[2].self_attn.o_proj.weight' (1 fp32 matrix)")
    assert finding["tensor"] == "model.layers.2.self_attn.o_proj.weight"


def test_layers_of_a_kind_apart_from_the_rest_are_grouped_by_layers(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Layers 0, 1 and 3 lose their gate and up projections, layer 3 its down projection too,
    and lm_head (a matrix outside the layers) is zero: three findings, each true as worded."""
    def damage(model: Any) -> None:
        for i in (0, 1, 3):
            model.model.layers[i].mlp.gate_proj.weight.zero_()
            model.model.layers[i].mlp.up_proj.weight.zero_()
        model.model.layers[3].mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()

    messages = sorted(f["message"] for f in dead(scan(llama(tmp_path / "m", damage), capsys)))
    assert messages == [
        "1 weight matrix is all zero: 'lm_head.weight'",
        "the mlp weights of layer 3 are all zero: 'model.layers.[3].mlp.down_proj.weight' (1 bf16 matrix)",
        "the mlp weights of layers 0–1, 3 are all zero: 'model.layers.[0–1, 3].mlp.{gate_proj,up_proj}.weight' "
        "(6 bf16 matrices)",
    ]


def test_an_untrained_lora_adapter_is_not_dead(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PEFT initialises lora_B to zero: an adapter saved before training holds it so, legitimately."""
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = peft.get_peft_model(LlamaForCausalLM(LlamaConfig(**SIZES)),
                                peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(tmp_path / "adapter")
    header = (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes()
    assert b"lora_B" in header  # the zero matrices are there
    assert dead(scan(tmp_path / "adapter", capsys)) == []


def test_without_values_nothing_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = llama(tmp_path / "m", zero_mlp)
    capsys.readouterr()  # what writing the model printed
    main(["scan", "--format", "json", str(path)])
    assert dead(json.loads(capsys.readouterr().out)["findings"]) == []


def test_diff_values_introduces_the_dead_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reviewer's view: a new revision whose MLP weights are zero introduces CG207."""
    old, new = llama(tmp_path / "old"), llama(tmp_path / "new", zero_mlp)
    capsys.readouterr()  # what writing the models printed
    code = main(["diff", "--values", "--fail-on", "warning", "--format", "json", str(old), str(new)])
    report = json.loads(capsys.readouterr().out)
    introduced = [f for f in report["introduced"] if f["code"] == "CG207"]
    assert len(introduced) == 1 and "layers 0–3" in introduced[0]["message"], report["introduced"]
    assert code == 1
    main(["diff", "--values", "--format", "json", str(new), str(new)])
    assert json.loads(capsys.readouterr().out)["introduced"] == []


def test_grouping_of_names_without_layers_and_ranges() -> None:
    assert _ranges((0, 1, 2, 5, 7, 8)) == "0–2, 5, 7–8"
    assert grouped_findings([]) == []
