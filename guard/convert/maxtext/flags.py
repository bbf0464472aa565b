"""The MaxText flags that describe the source model.

MaxText's converter and trainer take every size from ``configs/models/<model_name>.yml``
(and ``HF_MODEL_CONFIGS[model_name]``), not from the checkpoint; a checkpoint whose sizes
differ from the named model loads only with these overrides, and
``override_model_config=true`` is what lets the command line override a model's yml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard.convert.maxtext.source_config import dimensions, gemma3_query_scalar, gemma3_rope, rope_type, tied
from guard.convert.steps import bfloat16_sqrt
from guard.targets import TARGETS
from guard.targets.maxtext import Architecture


def rope_theta(config: dict[str, Any]) -> float | None:
    """transformers 4's ``rope_theta``, or transformers 5's ``rope_parameters["rope_theta"]``."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        return float(params["rope_theta"])
    return float(config["rope_theta"]) if config.get("rope_theta") is not None else None


# MaxText's convention (0.2.5), measured on tiny fp32 Gemma 2 models (docs/jax.md): every intermediate
# activation matched transformers' to <1e-6 and only the logits differed; rounding the table to
# bfloat16 on transformers' side brings them to 2.7e-7.
TIED_LOGITS_NOTE = (
    f"tied embeddings (logits_via_embedding=true): MaxText {TARGETS['maxtext'].version} rounds the embedding table "
    "to bfloat16 for the logits in every dtype (layers/embeddings.py attend_on_embedding: "
    "jnp.asarray(embedding_table, jnp.bfloat16); "
    "no flag avoids it), so its fp32 logits differ from transformers' by about 1e-3 of their scale "
    "(measured on tiny fp32 models: 1.2e-3 for a tied Llama, 1.6e-3 to 2.3e-3 for Gemma 2); the stored table "
    "is exact")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def maxtext_flags(row: Architecture, config: dict[str, Any], *, items: Path, scan: bool) -> list[str]:
    dims = dimensions(config)
    flags = {
        "model_name": model_name(row, config), "override_model_config": "true", "load_parameters_path": str(items),
        "scan_layers": str(scan).lower(), "base_emb_dim": dims["D"], "base_num_query_heads": dims["N"],
        "base_num_kv_heads": dims["K"], "head_dim": dims["H"], "base_num_decoder_layers": dims["L"],
        "vocab_size": dims["V"], "logits_via_embedding": str(tied(config)).lower(),
    }
    if tied(config):
        # tied logits are y @ table.T, then divided by sqrt(emb_dim) unless normalize_embedding_logits=false
        # (base.yml: true; nnx_decoders.py apply_output_head).  Only Gemma's table is stored times sqrt(D)
        # (embed_scale); any other tied model keeps its table as is and must not be divided.
        flags["normalize_embedding_logits"] = str(any(s.startswith("embed_scale") for p in row.params
                                                      for s in p.steps)).lower()
    if dims["F"]:
        flags["base_mlp_dim"] = dims["F"]
    theta = rope_theta(config)
    if theta is not None:
        flags["rope_max_timescale"] = _number(theta)
    eps = config.get("rms_norm_eps")
    if eps is not None:
        flags["normalization_layer_epsilon"] = repr(float(eps))
    if row.name == "gemma2":  # configs/models/gemma2-2b.yml: layers counted in local/global pairs
        flags["base_num_decoder_layers"] = dims["L"] // 2
        flags["final_logits_soft_cap"] = _number(config.get("final_logit_softcapping") or 0.0)
        flags["attn_logits_soft_cap"] = _number(config.get("attn_logit_softcapping") or 0.0)
        if config.get("sliding_window"):
            flags["sliding_window_size"] = int(config["sliding_window"])
    if row.name == "gemma3":
        flags.update(_gemma3_flags(config, dims))
    if row.moe:
        flags["num_experts"] = dims["E"]
        flags["num_experts_per_tok"] = int(config.get("num_experts_per_tok") or 0)
        flags["base_moe_mlp_dim"] = dims["Fe"] or dims["F"]
        if "norm_topk_prob" in config:
            flags["norm_topk_prob"] = str(bool(config["norm_topk_prob"])).lower()
    return [f"{k}={v}" for k, v in flags.items()]


def model_name(row: Architecture, config: dict[str, Any]) -> str:
    """The row's MaxText model_name; for Gemma 3 the one whose query scale is the config's (models/gemma3.py
    get_query_pre_attn_scalar: head_dim for gemma3-4b/12b, base_emb_dim // base_num_query_heads for gemma3-27b;
    plan refuses any other)."""
    if row.name == "gemma3" and gemma3_query_scalar(config) != dimensions(config)["H"]:
        return "gemma3-27b"
    return row.model_name


def _gemma3_flags(config: dict[str, Any], dims: dict[str, int]) -> dict[str, Any]:
    """configs/models/gemma3-*.yml's settings from the config: every layer counted (blocks of 6 are MaxText's
    business), both RoPEs (layers/attentions.py: local layers take local_rope_max_timescale and no linear factor),
    the window and the softcaps (Gemma 3 has none: 0 turns them off)."""
    rope = gemma3_rope(config)
    flags: dict[str, Any] = {
        "rope_max_timescale": _number(rope["full_attention"][1]),
        "local_rope_max_timescale": _number(rope["sliding_attention"][1]),
        "rope_linear_scaling_factor": _number(rope["full_attention"][2]),
        "final_logits_soft_cap": _number(config.get("final_logit_softcapping") or 0.0),
        "attn_logits_soft_cap": _number(config.get("attn_logit_softcapping") or 0.0),
    }
    if config.get("sliding_window"):
        flags["sliding_window_size"] = int(config["sliding_window"])
    return flags


def gemma3_embedding_note(config: dict[str, Any]) -> str | None:
    """MaxText's Gemma 3 hook scales the table by bfloat16(sqrt(D)); its decoder divides the tied logits by the
    exact sqrt(D) and feeds the looked-up rows as they are: a factor against transformers' fp32 forward."""
    width = dimensions(config)["D"]
    ratio = bfloat16_sqrt(width) / width ** 0.5
    if ratio == 1.0:
        return None
    return (f"MaxText's gemma3 conversion scales the embedding by sqrt({width}) rounded to bfloat16 "
            f"({_number(bfloat16_sqrt(width))}, not {width ** 0.5:.6g}: pad_and_scale_embedding), as transformers' "
            "bf16 forward does; MaxText feeds those rows as they are and divides the tied logits by the exact "
            f"sqrt, so against transformers' fp32 forward its inputs and logits carry a factor {ratio:.6f} "
            f"({abs(ratio - 1):.1e})")


def flag_notes(row: Architecture, config: dict[str, Any]) -> list[str]:
    """What the flags cannot say: settings of the source that MaxText's block hard-codes otherwise."""
    notes = []
    scaling = config.get("rope_scaling") or config.get("rope_parameters")
    if row.name == "llama3" and isinstance(scaling, dict):
        fixed = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
        differs = {k: scaling.get(k) for k, v in fixed.items() if scaling.get(k) is not None and scaling.get(k) != v}
        if differs:
            notes.append(f"MaxText's LLaMARotaryEmbedding hard-codes llama3 RoPE scaling {fixed}; this model has "
                         f"{differs}: MaxText's forward will not match it")
    elif rope_type(config) not in (None, "default") and row.name not in ("llama3", "gemma3"):
        notes.append(f"RoPE scaling {rope_type(config)!r} has no MaxText flag here; set rope_type and its options "
                     "by hand")
    if tied(config):
        notes.append(TIED_LOGITS_NOTE)
    embedding = gemma3_embedding_note(config) if row.name == "gemma3" else None
    if embedding:
        notes.append(embedding)
    if config.get("sliding_window") and config.get("use_sliding_window", True) and row.name in ("mistral", "mixtral"):
        notes.append(f"sliding_window={config['sliding_window']}: MaxText's {row.model_name} block attends globally")
    return notes
