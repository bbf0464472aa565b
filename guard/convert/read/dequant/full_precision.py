"""What makes a dequantized copy a full-precision model: one output dtype, and no quantization record left.

transformers reads ``quantization_config`` (and mlx-lm ``quantization``, optimum-quanto ``quanto_qmap.json``,
AutoGPTQ ``quantize_config.json``, AutoAWQ ``quant_config.json``) to build quantized layers; any of them left
beside full-precision weights would make it load the copy as packed again, and fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard import dtypes
from guard.write.cast import CastPolicy

QUANT_KEYS = ("quantization_config", "quantization")
QUANT_FILES = ("quanto_qmap.json", "quantize_config.json", "quant_config.json")
_CONFIG_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def dequantized_cast(cast: CastPolicy, config: dict[str, Any] | None) -> CastPolicy:
    """``--dtype`` as asked; with ``keep``, the config's compute dtype (its ``torch_dtype``), else fp32.

    A dequantized weight is made in float32 and rounded once to this dtype; the model's unquantized
    tensors (embeddings, norms, lm_head) get the same one cast, so the copy has one floating dtype.
    """
    if cast.target is not None:
        return cast
    declared = None
    if isinstance(config, dict):
        declared = next((config[k] for k in ("torch_dtype", "dtype") if isinstance(config.get(k), str)), None)
    target = _CONFIG_DTYPES.get(declared or "", "F32")
    assert dtypes.is_float(target)
    return CastPolicy(target, cast.keep_fp32)


def full_precision_config(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """config.json without the records that declare a quantization (nested configs too)."""
    if not isinstance(config, dict):
        return config
    out = {}
    for key, value in config.items():
        if key in QUANT_KEYS:
            continue
        out[key] = full_precision_config(value) if isinstance(value, dict) else value
    return out


def drop_quantization_files(directory: Path, carried: list[str]) -> list[str]:
    """Remove the quantizers' side files carried into the output (names from ``QUANT_FILES``)."""
    kept = []
    for name in carried:
        if name in QUANT_FILES:
            (directory / name).unlink()
        else:
            kept.append(name)
    return kept
