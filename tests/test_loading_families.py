"""CG123-CG127 against transformers 5.25, one tiny model per layout family and the flags published models set.

Each model is written by transformers' own ``save_pretrained``: as saved, the scan must find nothing (no
note either: the table or the class built from config.json vouches for it) and ``from_pretrained`` reports
nothing. Then one defect at a time is planted — a parameter removed, a layer added, a name drifted — and
the scan's verdict must be ``from_pretrained(output_loading_info=True)``'s: missing keys <-> CG123,
unexpected keys <-> CG124, a refusal (size mismatch) <-> CG125. The flag variants are the layouts of real
checkpoints whose modules differ from a type's default config (Falcon-40B's new decoder architecture and
ffn_hidden_size, biases on, q/k norms, dense first layers, DeepSeek-V2-Lite's q_lora_rank null).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from scanning import json_scan  # noqa: E402

LOADING = ("CG123", "CG124", "CG125", "CG127")
T = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
         num_hidden_layers=2, max_position_embeddings=64)
MLA = dict(kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
           first_k_dense_replace=1, n_group=1, topk_group=1, moe_intermediate_size=16, n_routed_experts=4,
           num_experts_per_tok=2, topk_method="greedy")
VIT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=28,
           patch_size=14)


def _config(model_type: str, **kwargs: object) -> Callable[[], object]:
    return lambda: transformers.CONFIG_MAPPING[model_type](**kwargs)


# name -> (family, class, config factory)
MODELS: dict[str, tuple[str, str, Callable[[], object]]] = {
    # decoder-only, with the flags published checkpoints set
    "falcon-40b layout": ("decoder-only", "FalconForCausalLM", _config(
        "falcon", hidden_size=32, num_attention_heads=4, vocab_size=96, num_hidden_layers=2,
        new_decoder_architecture=True, num_kv_heads=2, ffn_hidden_size=48)),
    "falcon serial, biases": ("decoder-only", "FalconForCausalLM", _config(
        "falcon", hidden_size=32, num_attention_heads=4, vocab_size=96, num_hidden_layers=2, parallel_attn=False,
        bias=True, multi_query=False)),
    "llama biases on": ("decoder-only", "LlamaForCausalLM", _config("llama", **T, attention_bias=True,
                                                                    mlp_bias=True)),
    "qwen3 q/k norms": ("decoder-only", "Qwen3ForCausalLM", _config("qwen3", **T, head_dim=8)),
    "qwen2 sliding window": ("decoder-only", "Qwen2ForCausalLM", _config("qwen2", **T, use_sliding_window=True,
                                                                        max_window_layers=1)),
    # MoE, the per-expert layout as saved
    "qwen3_moe dense first layer": ("moe per-expert", "Qwen3MoeForCausalLM", _config(
        "qwen3_moe", **T, moe_intermediate_size=16, num_experts=4, head_dim=8, mlp_only_layers=[0])),
    "qwen2_moe sparse step 2": ("moe per-expert", "Qwen2MoeForCausalLM", _config(
        "qwen2_moe", **T, moe_intermediate_size=16, num_experts=4, shared_expert_intermediate_size=24,
        decoder_sparse_step=2)),
    "deepseek_v2 lite (q_lora_rank null)": ("moe per-expert", "DeepseekV2ForCausalLM", _config(
        "deepseek_v2", **T, **{**MLA, "q_lora_rank": None})),
    "deepseek_v3 dense first layer": ("moe per-expert", "DeepseekV3ForCausalLM", _config("deepseek_v3", **T, **MLA)),
    # vision-language
    "mistral3": ("vision-language", "Mistral3ForConditionalGeneration", lambda: transformers.Mistral3Config(
        text_config=dict(model_type="mistral", **T, head_dim=8),
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14, head_dim=16))),
    "qwen2_5_vl": ("vision-language", "Qwen2_5_VLForConditionalGeneration", lambda: transformers.Qwen2_5_VLConfig(
        text_config=dict(**T, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32,
                           fullatt_block_indexes=[0]))),
    # saved under the older names (language_model.lm_head, untied): renamed before the base model's prefix
    "llava": ("vision-language", "LlavaForConditionalGeneration", lambda: transformers.LlavaConfig(
        text_config=dict(model_type="llama", **T),
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, image_size=28, patch_size=14, projection_dim=32))),
    # encoder-only, encoder-decoder, speech, vision
    "bert base": ("encoder-only", "BertModel", _config("bert", **T)),
    "bart": ("encoder-decoder", "BartForConditionalGeneration", _config(
        "bart", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=96, max_position_embeddings=64)),
    "whisper": ("speech", "WhisperForConditionalGeneration", _config(
        "whisper", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=96, num_mel_bins=8,
        max_source_positions=16, max_target_positions=16, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        decoder_start_token_id=0, suppress_tokens=[], begin_suppress_tokens=[])),
    "vit": ("vision", "ViTForImageClassification", _config("vit", **VIT)),
    "dinov2": ("vision", "Dinov2Model", _config("dinov2", **VIT)),
    # hybrid state-space
    "jamba": ("hybrid ssm", "JambaForCausalLM", _config(
        "jamba", **{**T, "num_hidden_layers": 4}, num_experts=4, num_experts_per_tok=2, attn_layer_period=2,
        attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_expand=2,
        mamba_dt_rank=4, use_mamba_kernels=False)),
    "falcon_h1": ("hybrid ssm", "FalconH1ForCausalLM", _config(
        "falcon_h1", **T, head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8,
        mamba_n_groups=1, mamba_chunk_size=16)),
    "qwen3_next": ("hybrid ssm", "Qwen3NextForCausalLM", _config(
        "qwen3_next", **{**T, "num_hidden_layers": 4}, head_dim=8, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16)),
    "qwen3_moe fused": ("moe fused", "Qwen3MoeForCausalLM", _config(
        "qwen3_moe", **T, moe_intermediate_size=16, num_experts=4, head_dim=8)),
    "mamba": ("hybrid ssm", "MambaForCausalLM", _config("mamba", hidden_size=32, num_hidden_layers=2, vocab_size=96,
                                                        state_size=8)),
}


def save(root: Path, name: str) -> Path:
    family, class_name, config = MODELS[name]
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(config())
    model.save_pretrained(root)
    if family == "moe fused":  # the experts as the model holds them, which transformers 5 loads as they are
        kept = {k for k, _ in model.named_parameters()} | {k for k, _ in model.named_buffers()}
        assert any(k.endswith("experts.gate_up_proj") for k in kept)
        write(root, {k: v.detach() for k, v in model.state_dict().items() if k in kept})
    return root


def tensors(root: Path) -> dict[str, torch.Tensor]:
    return load_file(root / "model.safetensors")


def write(root: Path, state: dict[str, torch.Tensor]) -> None:
    save_file({k: v.contiguous() for k, v in state.items()}, root / "model.safetensors", metadata={"format": "pt"})


def theirs(root: Path, name: str) -> tuple[set[str], dict]:
    """transformers' verdict as codes, and its loading report."""
    cls = getattr(transformers, MODELS[name][1])
    try:
        _, info = cls.from_pretrained(root, output_loading_info=True)
    except RuntimeError as exc:  # a size it refuses: as loaded, or where it merges per-expert tensors
        assert "ignore_mismatched_sizes" in str(exc) or "automatic conversion of the weights" in str(exc), exc
        return {"CG125"}, {}
    verdict = {code for code, key in (("CG123", "missing_keys"), ("CG124", "unexpected_keys"),
                                      ("CG125", "mismatched_keys")) if info[key]}
    return verdict, info


def ours(capsys: pytest.CaptureFixture[str], root: Path) -> list[dict]:
    _, report = json_scan(capsys, str(root))
    return [f for f in report["findings"] if f["code"] in LOADING]


_LAYER = re.compile(r"^(.*?(?:^|\.)(?:layers|layer|h|block|blocks))\.(\d+)\.(.*)$")


def _last_layer(state: dict[str, torch.Tensor]) -> tuple[str, int]:
    """The language model's layer container (the one with the most tensors) and its last index."""
    counts: dict[str, set[int]] = {}
    for name in state:
        match = _LAYER.match(name)
        if match:
            counts.setdefault(match.group(1), set()).add(int(match.group(2)))
    container = max(counts, key=lambda c: sum(1 for n in state if n.startswith(c + ".")))
    return container, max(counts[container])


def plant(root: Path, defect: str) -> str:
    """The defect written into the file; returns the tensor name it concerns."""
    state = tensors(root)
    container, last = _last_layer(state)
    if defect == "parameter removed":
        name = next(k for k in sorted(state) if k.startswith(f"{container}.{last}.") and k.endswith(".weight"))
        del state[name]
    elif defect == "layer added":
        lead = f"{container}.{last}."
        for key in [k for k in state if k.startswith(lead)]:
            state[f"{container}.{last + 1}.{key[len(lead):]}"] = state[key].clone()
        name = f"{container}.{last + 1}."
    elif defect == "shape changed":
        name = next(k for k in sorted(state) if k.startswith(f"{container}.{last}.") and k.endswith(".weight")
                    and state[k].dim() == 2 and state[k].shape[0] > 1)
        state[name] = state[name][:-1]
    else:
        raise AssertionError(defect)
    write(root, state)
    return name


@pytest.mark.parametrize("name", sorted(MODELS))
def test_as_saved_no_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    root = save(tmp_path / "m", name)
    verdict, info = theirs(root, name)
    assert verdict == set(), info
    assert ours(capsys, root) == []


@pytest.mark.parametrize("defect", ["parameter removed", "layer added", "shape changed"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_planted_defect_agrees(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, defect: str) -> None:
    root = save(tmp_path / "m", name)
    plant(root, defect)
    verdict, info = theirs(root, name)
    found = ours(capsys, root)
    # an expert's tensor taken from a per-expert file: CG123 names the expert, and says transformers refuses the
    # merged parameter (it raises, as for a size it refuses)
    claims = {"CG125" if f["code"] == "CG123" and "and refuses it" in f["message"] else f["code"] for f in found}
    assert claims == verdict, (found, info)
    if defect == "parameter removed" and verdict == {"CG123"}:
        [missing] = info["missing_keys"]
        [finding] = found
        assert missing.split(".")[-2] in finding["message"], (finding, missing)
    if defect == "shape changed":  # transformers raised (theirs() checked it): the message says it refuses
        assert found and all("refuses to load it" in f["message"] for f in found), found


@pytest.mark.parametrize(("name", "prefix"), [("qwen2_5_vl", "visual."), ("mistral3", "vision_tower.")])
def test_vision_tower_stripped_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                        prefix: str) -> None:
    """A text-only conversion that dropped the vision tower and kept vision_config (mlx-vlm#1963): transformers
    fills every parameter of the tower at random; the scan says so once, naming the prefix."""
    root = save(tmp_path / "m", name)
    state = tensors(root)
    write(root, {k: v for k, v in state.items() if not k.startswith(prefix)})
    assert "vision_config" in json.loads((root / "config.json").read_text())
    verdict, info = theirs(root, name)
    assert verdict == {"CG123"} and all(prefix.rstrip(".") in k for k in info["missing_keys"]), info
    found = ours(capsys, root)
    assert [f["code"] for f in found] == ["CG123"], found
    [finding] = found
    assert finding["severity"] == "error"
    assert finding["message"].startswith("the vision tower would be random: config.json declares vision_config")
    assert f"{len(info['missing_keys'])} parameter(s) under '" in finding["message"]
    assert prefix.rstrip(".") in finding["tensor"]


@pytest.mark.parametrize("name", ["mistral3", "qwen2_5_vl"])
def test_head_removed_with_the_tie_false_names_lm_head(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       name: str) -> None:
    """A vision-language model saved untied whose file lacks lm_head.weight (transformers#43429, Ministral-3;
    Qwen3-VL-Embedding#89): transformers reports it missing and generates from a random head."""
    _, class_name, config = MODELS[name]
    built = config()
    built.tie_word_embeddings = False
    if hasattr(built, "text_config"):
        built.text_config.tie_word_embeddings = False
    torch.manual_seed(0)
    root = tmp_path / "m"
    getattr(transformers, class_name)(built).save_pretrained(root)
    state = tensors(root)
    head = next(k for k in state if k.endswith("lm_head.weight"))
    del state[head]
    write(root, state)
    verdict, info = theirs(root, name)
    assert verdict == {"CG123"} and info["missing_keys"] == {"lm_head.weight"}, info
    [finding] = ours(capsys, root)
    assert finding["code"] == "CG123" and finding["severity"] == "error"
    assert "'lm_head.weight'" in finding["message"]
    assert "tie_word_embeddings is false" in finding["message"] and "random head" in finding["message"]


@pytest.mark.parametrize(("name", "saved", "drifted"), [
    ("mamba", "backbone.embeddings.weight", "backbone.embedding.weight"),  # nemotron_h's drift, transformers#48075
    ("qwen2_5_vl", "model.norm.weight", "model.norm_f.weight"),
])
def test_name_drift_is_reported_as_a_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, saved: str,
                                          drifted: str) -> None:
    """A tensor saved under a name that drifted from the class's, which no conversion of transformers maps: it
    drops the one and fills the other at random. Reported as the pair, in the file's name for the dropped one."""
    root = save(tmp_path / "m", name)
    state = tensors(root)
    state[drifted] = state.pop(saved)
    write(root, state)
    verdict, info = theirs(root, name)
    assert verdict == {"CG123", "CG124"}, info
    # (a tied head is reported missing beside the embeddings it is tied to: the drifted name is the one asked about)
    [missing] = [k for k in info["missing_keys"] if k.split(".")[-2:] == saved.split(".")[-2:]]
    [unexpected] = info["unexpected_keys"]
    found = {f["code"]: f for f in ours(capsys, root)}
    assert set(found) == {"CG123", "CG124"}, found
    assert f"would fill '{missing}' at random and drop '{drifted}'" in found["CG123"]["message"]
    assert "the name drifted" in found["CG123"]["message"]
    assert found["CG124"]["tensor"] == drifted and f"drifted from '{missing}'" in found["CG124"]["message"]
    assert unexpected.split(".")[-2:] == drifted.split(".")[-2:]  # transformers names it renamed; we, as saved


def test_diff_reports_the_stripped_tower_as_introduced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``diff`` judges each side with the same rules and table: the conversion that stripped the tower introduces
    the finding."""
    from guard.cli import main

    before = save(tmp_path / "before", "qwen2_5_vl")
    after = save(tmp_path / "after", "qwen2_5_vl")
    write(after, {k: v for k, v in tensors(after).items() if not k.startswith("visual.")})
    capsys.readouterr()
    assert main(["diff", str(before), str(after)]) == 1
    out = capsys.readouterr().out
    introduced = out[out.index("findings introduced"):]
    assert "CG123" in introduced and "the vision tower would be random" in introduced
