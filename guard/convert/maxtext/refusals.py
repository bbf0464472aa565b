"""What a MaxText row cannot express, refused (CG304, from plan and run), never approximated: one reason a line.

Each reason names what MaxText's block hard-codes (its module and function) against what config.json says.
"""

from __future__ import annotations

from typing import Any

from guard.convert.maxtext.source_config import gemma3_layer_types, gemma3_query_scalar, gemma3_rope, tied
from guard.targets.maxtext import GEMMA3_BLOCK, Architecture

# model_types that MaxText names but no row converts, with why (one line each); they stay out of the rows'
# model_types, so parity --against maxtext keeps calling them an architecture MaxText has no row for (CG303)
UNCONVERTED = {
    "gemma3": "Gemma3ForConditionalGeneration (text + SigLIP vision tower): MaxText's gemma3 mapping converts the "
              "two together (GEMMA3_MAXTEXT_TO_HF_PARAM_MAPPING: params/vision_encoder, run with use_multimodal=true), "
              "and the gemma3 row writes the text decoder only; a text-only Gemma3ForCausalLM (model_type "
              "gemma3_text) converts",
}


def unsupported_layouts(row: Architecture, config: dict[str, Any], dims: dict[str, int]) -> list[str]:
    """Configurations a row's MaxText decoder cannot express: refused, not approximated."""
    reasons = []
    if row.name == "qwen3_moe" and (config.get("mlp_only_layers") or int(config.get("decoder_sparse_step", 1)) != 1):
        reasons.append("dense layers among the MoE ones (mlp_only_layers / decoder_sparse_step): MaxText's "
                       "qwen3_moe block is MoE in every layer")
    if row.name == "qwen3_moe" and not config.get("norm_topk_prob", False):
        reasons.append("norm_topk_prob is false: MaxText's MoE always renormalizes the top-k router weights "
                       "(a softmax over the top-k logits, layers/moe.py), so its forward would differ")
    if row.name == "gemma2":
        reasons.extend(_gemma2_refusals(config, dims))
    if row.name == "gemma3":
        reasons.extend(_gemma3_refusals(config, dims))
    if row.moe and not dims["E"]:
        reasons.append("no num_experts / num_local_experts in config.json")
    return reasons


def _gemma2_refusals(config: dict[str, Any], dims: dict[str, int]) -> list[str]:
    """What MaxText's gemma2 block (models/gemma2.py) hard-codes: layers paired local/global, tied logits, the
    query scaled by 1/sqrt(head_dim) in the kernel, tanh-approximated GELU."""
    reasons = []
    if dims["L"] % 2:
        reasons.append(f"{dims['L']} layers: MaxText's gemma2 pairs a local and a global layer, so it needs an even "
                       "count")
    if not tied(config):
        reasons.append("untied lm_head: MaxText's gemma2 computes the logits from the embedding (logits_via_embedding)")
    scalar = config.get("query_pre_attn_scalar")
    if scalar is not None and float(scalar) != float(dims["H"]):
        reasons.append(f"query_pre_attn_scalar {scalar} != head_dim {dims['H']}: MaxText's conversion scales the "
                       "query kernel by 1/sqrt(head_dim) (scale_query_layer)")
    activation = config.get("hidden_activation") or config.get("hidden_act")
    if activation not in (None, "gelu_pytorch_tanh"):
        reasons.append(f"hidden_activation {activation!r}: MaxText's gemma2 runs gelu with the tanh approximation")
    return reasons


def _gemma3_refusals(config: dict[str, Any], dims: dict[str, int]) -> list[str]:
    """What MaxText's gemma3 block (models/gemma3.py, layers/attentions.py) hard-codes: the 5 local + 1 global
    pattern, tied logits, a query scale of head_dim**-0.5 (gemma3-4b/12b) or (emb_dim // heads)**-0.5
    (gemma3-27b), causal attention, the linear RoPE factor on global layers only, tanh-approximated GELU."""
    reasons = []
    types = config.get("layer_types")
    pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern"))
    if isinstance(types, list) and types != gemma3_layer_types(dims["L"]):
        reasons.append("layer_types differ from MaxText's fixed pattern (5 sliding-window layers, then 1 global: "
                       "models/gemma3.py GEMMA3_ATTENTION_PATTERN)")
    elif not isinstance(types, list) and pattern is not None and int(pattern) != GEMMA3_BLOCK:
        reasons.append(f"sliding_window_pattern {pattern}: MaxText's gemma3 has 1 global layer in every 6 "
                       "(GEMMA3_ATTENTION_PATTERN)")
    if not tied(config):
        reasons.append("untied lm_head: MaxText's gemma3 computes the logits from the embedding (logits_via_embedding)")
    scalar = gemma3_query_scalar(config)
    if scalar not in (float(dims["H"]), float(dims["D"] // dims["N"])):
        reasons.append(f"query_pre_attn_scalar {scalar:g} is neither head_dim {dims['H']} (gemma3-4b/12b) nor "
                       f"hidden_size // num_attention_heads {dims['D'] // dims['N']} (gemma3-27b): MaxText's gemma3 "
                       "scales the query by one of those (models/gemma3.py get_query_pre_attn_scalar)")
    if config.get("use_bidirectional_attention"):
        reasons.append("use_bidirectional_attention: MaxText's gemma3 decoder attends causally")
    rope = gemma3_rope(config)
    if rope["full_attention"][0] not in ("default", "linear"):
        reasons.append(f"global layers' RoPE {rope['full_attention'][0]!r}: MaxText's gemma3 has plain RoPE with a "
                       "linear factor (rope_linear_scaling_factor)")
    if rope["sliding_attention"][0] != "default":
        reasons.append(f"sliding layers' RoPE {rope['sliding_attention'][0]!r}: MaxText's gemma3 runs them unscaled "
                       "(layers/attentions.py: no linear factor on local layers)")
    activation = config.get("hidden_activation") or config.get("hidden_act")
    if activation not in (None, "gelu_pytorch_tanh"):
        reasons.append(f"hidden_activation {activation!r}: MaxText's gemma3 runs gelu with the tanh approximation")
    return reasons
