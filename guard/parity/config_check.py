"""Parity's first question: does each side read the model the source's config.json means?

Outputs can agree while both sides run the wrong model: transformers 4.57 reads a config that
transformers 5 wrote (``rope_parameters``) with the default rope_theta on the PyTorch side and on
the Flax side alike, and transformers 4's Flax Llama, Mistral and Gemma compute RoPE with a fixed
base whatever config.json says (``guard.convert.legacy_config``).  So the values that change the
model are compared first: what the source's writer meant (transformers 5's keys read as 5 reads
them) against what each side's reader takes.  A difference is CG302 naming the key and the side.
"""

from __future__ import annotations

from typing import Any

from guard import dtypes
from guard.catalogue import make_finding
from guard.convert.legacy_config import DEFAULT_THETA, FLAX_FIXED_ROPE_BASE, rope_meaning
from guard.findings import Finding

SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers")
T5_TYPES = ("t5", "mt5", "longt5")  # tie_word_embeddings also says whether the decoder output is scaled


def meant_values(raw: dict[str, Any], hf_config: Any) -> dict[str, Any]:
    """The source as its writer meant it: RoPE from ``rope_parameters`` (5.x) or the 4.x keys, the config
    dtype as 4.56+ and 5.x read it (``dtype``, else ``torch_dtype``), the sizes as transformers reads them."""
    theta, scaling, _problem = rope_meaning(raw)
    values: dict[str, Any] = {key: getattr(hf_config, key, None) for key in SIZE_KEYS}
    model_type = raw.get("model_type")
    if theta is not None or model_type in FLAX_FIXED_ROPE_BASE:
        values["rope_theta"] = theta if theta is not None else DEFAULT_THETA
        values["rope_scaling"] = _scaling(scaling)
    values["dtype"] = config_dtype(raw)
    if model_type in T5_TYPES:  # 5.x: scale_decoder_outputs holds what tie_word_embeddings meant in 4.x
        values["tie_word_embeddings"] = raw.get("scale_decoder_outputs", raw.get("tie_word_embeddings", True)) \
            is not False
    return values


def read_values(raw: dict[str, Any], hf_config: Any, *, flax: bool) -> dict[str, Any]:
    """What one side's transformers takes: its config object (4.x's keys, or 5.x's ``rope_parameters``),
    and for a Flax class with a fixed RoPE base, that base and no scaling."""
    values: dict[str, Any] = {key: getattr(hf_config, key, None) for key in SIZE_KEYS}
    fixed = FLAX_FIXED_ROPE_BASE.get(raw.get("model_type", "")) if flax else None  # no model_type: no row
    if fixed is not None:
        values["rope_theta"], values["rope_scaling"] = fixed, None
    elif hasattr(hf_config, "rope_theta"):
        values["rope_theta"] = float(hf_config.rope_theta)
        values["rope_scaling"] = _scaling(getattr(hf_config, "rope_scaling", None))
    elif isinstance(rope := getattr(hf_config, "rope_parameters", None), dict) and "rope_theta" in rope:
        # transformers 5's config class (the PyTorch side on 5.x): no rope_theta attribute, one RoPE here
        values["rope_theta"] = float(rope["rope_theta"])
        values["rope_scaling"] = _scaling(rope)
    values["dtype"] = config_dtype(raw)
    if raw.get("model_type") in T5_TYPES:
        values["tie_word_embeddings"] = bool(getattr(hf_config, "tie_word_embeddings", True))
    return values


def config_dtype(raw: dict[str, Any]) -> str | None:
    """transformers 4.56+'s rule (and 5's): ``dtype``, else ``torch_dtype``; as a safetensors code."""
    name = raw.get("dtype") if raw.get("dtype") is not None else raw.get("torch_dtype")
    return dtypes.parse_dtype_name(name) if isinstance(name, str) and name != "auto" else None


def config_disagreements(meant: dict[str, Any], sides: dict[str, dict[str, Any]], *, where: str,
                         same_weights_dtype: bool) -> list[Finding]:
    """CG302 per key and side whose reading differs from the meaning (sizes and RoPE always; the config
    dtype only where both sides hold the same weights' dtype: a cast changes it on purpose)."""
    findings = []
    for key, value in meant.items():
        if value is None or (key == "dtype" and not same_weights_dtype):
            continue
        for side, values in sides.items():
            read = values.get(key)
            if read is None and key == "dtype":
                continue  # a config with no dtype key: the loader's own default, not a reading
            if key in values and read != value:
                findings.append(make_finding(
                    "CG302", where, f"config: the source's config.json means {key} = {_shown(value)}, but the "
                                    f"{side} side reads {_shown(read)}: it runs another model than the source's "
                                    "(a transformers 5 config read by 4.x, or a value its class cannot hold)"))
    return findings


def _scaling(value: object) -> dict[str, Any] | None:
    """rope_scaling without the keys that only name the default (``{"rope_type": "default"}`` is none)."""
    if not isinstance(value, dict):
        return None
    rope_type = value.get("rope_type", value.get("type", "default"))
    rest = {k: v for k, v in value.items() if k not in ("type", "rope_type", "rope_theta")}
    return None if rope_type == "default" and not rest else {**rest, "rope_type": rope_type}


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)[:200]
