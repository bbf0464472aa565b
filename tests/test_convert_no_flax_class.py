"""Architectures transformers 4 has no Flax class for: a refusal that says so, and where to go instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from test_convert import convert  # noqa: E402

SMALL = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32}
MODELS = {  # model_type -> (config class, model class, extra config)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 8}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 2, "num_experts_per_tok": 1}),
}


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_no_flax_class_is_refused_with_what_is_true(tmp_path: Path, model_type: str) -> None:
    config_name, model_name, extra = MODELS[model_type]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**SMALL, **extra)
    assert config.model_type == model_type
    assert not hasattr(transformers, "Flax" + model_name)  # transformers 4.57 itself has no Flax twin
    src = tmp_path / "src"
    getattr(transformers, model_name)(config).save_pretrained(src)
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "-f", "json", "-o", report) == 1
    data = json.loads(report.read_text())
    [finding] = data["findings"]
    assert finding["code"] == "CG304"
    assert f"model_type '{model_type}' has no Flax class in transformers 4.x" in finding["message"]
    assert "both PyTorch and Flax" not in finding["message"]
    step = data["extra"]["conversion"]["next_step"]
    assert "--to maxtext" in step and "tunix" in step and "check its model_type" not in step
    assert not (tmp_path / "f").exists()


def test_a_shape_problem_keeps_the_model_type_hint(tmp_path: Path) -> None:
    """Where the architecture is known and the tensors do not fit it, config.json is the thing to check."""
    from test_convert_families import save_tiny

    src = save_tiny(tmp_path, "llama", "LlamaForCausalLM")
    config = json.loads((src / "config.json").read_text())
    config["vocab_size"] += 1
    (src / "config.json").write_text(json.dumps(config))
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "-f", "json", "-o", report) == 1
    data = json.loads(report.read_text())
    assert {f["code"] for f in data["findings"]} == {"CG304"}
    assert "check its model_type" in data["extra"]["conversion"]["next_step"]
