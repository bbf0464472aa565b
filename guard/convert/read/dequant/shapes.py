"""A weight's shape from config.json, where the stored layout loses it (optimum-quanto int2/int4).

quanto groups a weight row-major into ``[numel / group, group]`` and packs that, so the elements come back
in order but ``[out, in]`` is not in the file; transformers takes it from the model class.  Here it comes
from the config's sizes for the projections decoder models name alike; the product must equal the
element count, or there is no answer (and the conversion is refused with CG111, never a guess).
"""

from __future__ import annotations

from typing import Any

# the module's last name -> (out, in), as config size expressions
_LINEARS: dict[str, tuple[str, str]] = {
    "q_proj": ("heads*head_dim", "hidden_size"), "k_proj": ("kv_heads*head_dim", "hidden_size"),
    "v_proj": ("kv_heads*head_dim", "hidden_size"), "o_proj": ("hidden_size", "heads*head_dim"),
    "gate_proj": ("intermediate_size", "hidden_size"), "up_proj": ("intermediate_size", "hidden_size"),
    "down_proj": ("hidden_size", "intermediate_size"), "lm_head": ("vocab_size", "hidden_size"),
    "embed_tokens": ("vocab_size", "hidden_size"),
}


def _sizes(config: dict[str, Any]) -> dict[str, int]:
    text = config.get("text_config")
    if not isinstance(text, dict):
        text = config
    get = {k: v for k, v in text.items() if isinstance(v, int) and not isinstance(v, bool)}
    heads = get.get("num_attention_heads", 0)
    hidden = get.get("hidden_size", 0)
    head_dim = get.get("head_dim") or (hidden // heads if heads else 0)
    return {"hidden_size": hidden, "intermediate_size": get.get("intermediate_size", 0),
            "vocab_size": get.get("vocab_size", 0), "heads*head_dim": heads * head_dim,
            "kv_heads*head_dim": get.get("num_key_value_heads", heads) * head_dim}


def config_shape(weight: str, config: Any, numel: int) -> tuple[int, ...] | None:
    """``(out, in)`` of the weight named ``weight`` (``...mlp.down_proj.weight``) when the config's sizes say so."""
    if not isinstance(config, dict):
        return None
    parts = weight.split(".")
    module = parts[-2] if parts[-1] == "weight" and len(parts) > 1 else parts[-1]
    row = _LINEARS.get(module)
    if row is None:
        return None
    sizes = _sizes(config)
    shape = (sizes[row[0]], sizes[row[1]])
    return shape if shape[0] * shape[1] == numel and numel else None
