"""config.json for the transformers-4 Flax target: what transformers 5 wrote, in the keys 4.x reads.

transformers 5 writes ``rope_parameters: {rope_theta, rope_type, ...}`` instead of the top-level
``rope_theta`` / ``rope_scaling`` of 4.x (``modeling_rope_utils.RotaryEmbeddingConfigMixin``,
``standardize_rope_params``), and ``dtype`` instead of ``torch_dtype`` (4.56 reads both; 4.40-4.55 only
``torch_dtype``).  transformers 4.57 reads a v5 config without complaint and takes the default theta:
a silent wrong model.  The other keys v5 dropped (generation defaults, ``is_decoder``, ...) read as
4.x's defaults, which are what v5 means by leaving them out.  Two more moved meanings (found by comparing
5.25's and 4.57's config classes of every architecture convert pairs): T5's ``scale_decoder_outputs``
(5.x forces ``tie_word_embeddings`` true and keeps the v1.1 "untied, unscaled" meaning there, which 4.x
reads from ``tie_word_embeddings``), and Gemma's activation (5.x reads ``hidden_act``; 4.x's Flax Gemma
reads ``hidden_activation`` and otherwise takes the tanh GELU).

And what no config can change: transformers 4's Flax Llama, Mistral and Gemma build their rotary
tables with a fixed base of 10000 and no scaling (``create_sinusoidal_positions`` in
``modeling_flax_llama.py``, ``modeling_flax_mistral.py``, ``modeling_flax_gemma.py``; Mistral stores
``config.rope_theta`` and never uses it).  A model meaning another theta, a scaled RoPE, or one RoPE per
layer type has no Flax class that computes it: refused (CG304) before anything is written.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from guard.catalogue import make_finding
from guard.convert.map.families import ALIASES, FAMILIES
from guard.findings import Finding

DEFAULT_THETA = 10_000.0  # RotaryEmbeddingConfigMixin.default_theta (5.x); LlamaConfig's rope_theta default (4.x)
# model_type -> the base its transformers-4 Flax class hard-codes (it reads neither rope_theta nor rope_scaling)
FLAX_FIXED_ROPE_BASE = {"llama": 10_000.0, "mistral": 10_000.0, "gemma": 10_000.0}
KNOWN_ROPE_TYPES_4X = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")  # 4.57's ROPE_INIT_FUNCTIONS


def rope_meaning(config: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None, str | None]:
    """(rope_theta, rope_scaling as 4.x spells it or None, a reason 4.x cannot hold it) as the writer meant it.

    A ``rope_parameters`` dict is transformers 5's: its ``rope_theta`` (default 10000) and its
    ``rope_type`` with the other entries.  Without one, the 4.x keys mean what they say."""
    params = config.get("rope_parameters")
    if params is None:
        theta = config.get("rope_theta")
        scaling = config.get("rope_scaling")
        return (float(theta) if _number(theta) else None), (scaling if isinstance(scaling, dict) else None), None
    if not isinstance(params, dict):
        return None, None, f"rope_parameters is {type(params).__name__}, not an object"
    if params and all(isinstance(v, dict) or v is None for v in params.values()):
        return None, None, f"rope_parameters holds one RoPE per layer type ({', '.join(sorted(params))})"
    theta = params.get("rope_theta", DEFAULT_THETA)
    if not _number(theta):
        return None, None, f"rope_parameters.rope_theta is {theta!r}, not a number"
    rope_type = params.get("rope_type", params.get("type", "default"))
    rest = {k: v for k, v in params.items() if k not in ("rope_theta", "type")}
    scaling = None if rope_type == "default" and set(rest) <= {"rope_type"} else {**rest, "rope_type": rope_type}
    if rope_type not in KNOWN_ROPE_TYPES_4X:
        return float(theta), scaling, f"rope_type {str(rope_type)[:40]!r} is not one transformers 4.x knows"
    return float(theta), scaling, None


def flax_target_config(config: dict[str, Any], *, where: str) -> tuple[dict[str, Any], list[Finding]]:
    """The config the transformers-4 Flax target reads as the source meant it, or a CG304 refusal."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or ALIASES.get(model_type, model_type) not in FAMILIES:
        return config, []  # no Flax class to write for: the mapping refuses it, saying so
    out = dict(config)
    if "dtype" in out:  # 4.40-4.55 read only torch_dtype; 4.56+ read dtype first: both, the same value
        out["torch_dtype"] = out["dtype"]
    if "scale_decoder_outputs" in out:  # T5 in 5.x: tie_word_embeddings forced true, 4.x's meaning moved here
        out["tie_word_embeddings"] = out.pop("scale_decoder_outputs") is not False
    if model_type == "gemma" and out.get("hidden_activation") is None and isinstance(out.get("hidden_act"), str):
        # 5.x reads hidden_act ("gelu" meaning the tanh approximation); 4.x's Flax Gemma reads hidden_activation
        out["hidden_activation"] = "gelu_pytorch_tanh" if out["hidden_act"] == "gelu" else out["hidden_act"]
    theta, scaling, problem = rope_meaning(config)
    if "rope_parameters" in out and problem is None:
        del out["rope_parameters"]
        out["rope_theta"] = theta
        out["rope_scaling"] = scaling
    fixed = FLAX_FIXED_ROPE_BASE.get(model_type)
    if fixed is None:
        if problem is not None and "rope_parameters" in config:
            return out, [make_finding("CG304", where, f"config.json's {problem}: transformers 4.x cannot read it")]
        return out, []
    refusal = problem
    if config.get("use_bidirectional_attention"):
        refusal = "the model's attention is bidirectional (use_bidirectional_attention)"
    if refusal is None and theta is not None and theta != fixed:
        refusal = f"the model's rope_theta is {theta:g}"
    if refusal is None and scaling is not None:
        refusal = f"the model's RoPE is scaled (rope_type {str(scaling.get('rope_type'))[:40]!r})"
    if refusal is not None:
        return out, [make_finding(
            "CG304", where, f"{refusal}, but transformers 4's Flax {model_type} class is causal and computes RoPE "
                            f"with the fixed base {fixed:g} and no scaling, whatever config.json says: its outputs "
                            "would not be this model's")]
    return out, []


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
