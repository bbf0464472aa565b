"""What a source config.json says, as the MaxText rows read it: sizes, tied embeddings, RoPE.

transformers 4 and 5 write some of it under different keys (``rope_scaling`` / ``rope_parameters``,
Gemma 3's ``rope_local_base_freq`` / per-layer-type ``rope_parameters``); each reader takes both.
"""

from __future__ import annotations

from typing import Any

from guard.targets.maxtext import GEMMA3_BLOCK


def rope_type(config: dict[str, Any]) -> str | None:
    """transformers 4's ``rope_scaling`` or transformers 5's ``rope_parameters``: its rope_type (or type)."""
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if isinstance(value, dict) and (value.get("rope_type") or value.get("type")):
            return str(value.get("rope_type") or value.get("type"))
    return None


def dimensions(config: dict[str, Any]) -> dict[str, int]:
    """The symbols the rows' shapes use, from config.json."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    dims = {"D": int(config["hidden_size"]), "V": int(config["vocab_size"]), "L": int(config["num_hidden_layers"]),
            "N": heads, "K": kv_heads, "H": head_dim, "q": heads * head_dim, "kv": kv_heads * head_dim,
            "F": int(config.get("intermediate_size") or 0),
            "E": int(config.get("num_local_experts") or config.get("num_experts") or 0),
            "Fe": int(config.get("moe_intermediate_size") or 0)}
    return dims


def tied(config: dict[str, Any]) -> bool:
    """transformers' default: tied for Gemma's configs, untied otherwise (config.json may leave it out)."""
    return bool(config.get("tie_word_embeddings", str(config.get("model_type", "")).startswith("gemma")))


def gemma3_rope(config: dict[str, Any]) -> dict[str, tuple[str, float, float]]:
    """Gemma 3's two RoPEs, {"full_attention" | "sliding_attention": (rope_type, theta, linear factor)}, from
    transformers 5's per-layer-type ``rope_parameters`` or transformers 4's ``rope_theta``,
    ``rope_local_base_freq`` and ``rope_scaling`` (global layers only); transformers' defaults where absent."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        found = {kind: params.get(kind) or {} for kind in ("full_attention", "sliding_attention")}
    else:
        scaling = config.get("rope_scaling") or {}
        found = {"full_attention": {**scaling, "rope_theta": config.get("rope_theta")},
                 "sliding_attention": {"rope_theta": config.get("rope_local_base_freq")}}
    defaults = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
    return {kind: (str(p.get("rope_type") or p.get("type") or "default"),
                   float(p.get("rope_theta") or defaults[kind]), float(p.get("factor") or 1.0))
            for kind, p in found.items()}


def gemma3_layer_types(layers: int) -> list[str]:
    """MaxText's fixed Gemma 3 pattern (models/gemma3.py get_attention_type): layer i global iff i % 6 == 5."""
    return ["full_attention" if i % GEMMA3_BLOCK == GEMMA3_BLOCK - 1 else "sliding_attention" for i in range(layers)]


def gemma3_query_scalar(config: dict[str, Any]) -> float:
    return float(config.get("query_pre_attn_scalar") or 256)  # transformers' Gemma3TextConfig default
