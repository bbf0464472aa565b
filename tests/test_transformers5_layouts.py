"""Layouts only transformers 5 writes, scanned: MoE experts per expert and fused, Gemma 3 multimodal.

transformers 5 holds MoE experts fused in memory (``mlp.experts.gate_up_proj``, one 3-D tensor per layer)
and, by default, saves them per expert as 4.x did (``save_pretrained(save_original_format=True)``);
``save_original_format=False`` writes the fused tensors.  Its config.json says ``dtype`` (no
``torch_dtype``) and ``rope_parameters``, and its shard index carries ``total_parameters``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402
from scanning import codes, json_scan  # noqa: E402

# written by transformers 5: never selected in .venv-tf4 (make test runs only the transformers4 tests there)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                                 reason="layouts written by transformers 5")]
FUSED_GATE_UP = "model.layers.1.mlp.experts.gate_up_proj"


def qwen3_moe(*, fp32_experts: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64)).to(torch.bfloat16)
    if fp32_experts:  # one fused parameter left fp32: 4 experts x (gate, up) on disk when saved per expert
        param = model.get_parameter(FUSED_GATE_UP)
        param.data = param.data.float()
    return model


def tensor_names(root: Path) -> set[str]:
    names: set[str] = set()
    for path in root.glob("*.safetensors"):
        with safe_open(path, "pt") as fh:
            names.update(fh.keys())
    return names


@pytest.mark.parametrize("original", [True, False], ids=["per-expert", "fused"])
def test_moe_experts_per_expert_and_fused_get_the_same_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              original: bool) -> None:
    model, root = qwen3_moe(), tmp_path / "moe"
    model.save_pretrained(root, save_original_format=original, max_shard_size="20KB")
    names = tensor_names(root)
    assert ("model.layers.1.mlp.experts.3.gate_proj.weight" in names) is original
    assert (FUSED_GATE_UP in names) is not original
    config = json.loads((root / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "torch_dtype" not in config and "rope_theta" not in config
    assert config["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    index = json.loads((root / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_parameters"] == model.num_parameters()
    code, report = json_scan(capsys, str(root), "--expect", "config")
    assert code == 0 and codes(report) <= {"CG104"}, report["findings"]
    [weights] = report["models"][0]["sets"]
    assert weights["parameters"] == model.num_parameters() and set(weights["dtypes"]) == {"BF16"}


@pytest.mark.parametrize(("original", "tensors"), [(True, 8), (False, 1)], ids=["per-expert", "fused"])
def test_a_planted_fp32_expert_is_found_in_both_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       original: bool, tensors: int) -> None:
    model, root = qwen3_moe(fp32_experts=True), tmp_path / "moe"
    model.save_pretrained(root, save_original_format=original)
    code, report = json_scan(capsys, str(root), "--expect", "config")
    found = {f["code"]: f for f in report["findings"]}
    assert code == 1 and {"CG101", "CG102"} <= set(found)
    assert found["CG101"]["message"].startswith(f"{tensors} floating tensor(s) (4,096 parameters) are fp32")
    named = found["CG101"]["tensor"]
    assert named == (FUSED_GATE_UP if not original else "model.layers.1.mlp.experts.0.gate_proj.weight")
    [weights] = report["models"][0]["sets"]
    assert weights["dtypes"]["F32"] == {"tensors": tensors, "parameters": 4096, "bytes": 16384}


def test_gemma3_multimodal_is_one_clean_bf16_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma3ForConditionalGeneration: a text config with one RoPE per layer type, a SigLIP tower; saved
    under the checkpoint names (``language_model.model.*``, ``vision_tower.*``)."""
    torch.manual_seed(0)
    config = transformers.Gemma3Config(
        text_config={"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                     "max_position_embeddings": 64, "sliding_window": 16},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 28, "patch_size": 14},
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298)
    model = transformers.Gemma3ForConditionalGeneration(config).to(torch.bfloat16)
    root = tmp_path / "gemma3"
    model.save_pretrained(root)
    written = json.loads((root / "config.json").read_text())
    assert written["dtype"] == "bfloat16" and written["architectures"] == ["Gemma3ForConditionalGeneration"]
    assert set(written["text_config"]["rope_parameters"]) == {"full_attention", "sliding_attention"}
    names = tensor_names(root)
    assert any(n.startswith("language_model.model.layers.") for n in names)
    assert any(n.startswith("vision_tower.") for n in names)
    code, report = json_scan(capsys, str(root), "--expect", "config")
    assert code == 0 and codes(report) <= {"CG104"}, report["findings"]
    [weights] = report["models"][0]["sets"]
    assert weights["parameters"] == model.num_parameters() and set(weights["dtypes"]) == {"BF16"}
