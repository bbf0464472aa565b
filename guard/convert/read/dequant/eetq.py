"""EETQ int8 weight-only: ``W[o, i] = weight[i, o] * weight_scales[o]`` (weight stored ``[in, out]``).

This reads the plain transposed layout transformers' ``EetqLinear`` declares; EETQ's CUDA preprocessing
(``quant_weights``' interleaved CUTLASS layout) cannot be told apart from headers and is not undone here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read, row_bands

if TYPE_CHECKING:
    import numpy as np


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    shape = read.info(module.payload).shape
    if len(shape) != 2:
        raise DequantError("CG111", module.payload, f"EETQ weight {list(shape)} is not a matrix")
    return {module.weight: (shape[1], shape[0])}


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    import numpy as np

    out_features, in_features = outputs(module, quant, read)[module.weight]
    scales = read(module.components["scales"]).astype(np.float32).reshape(-1)
    if scales.size != out_features or not np.isfinite(scales).all():
        raise DequantError("CG205" if scales.size == out_features else "CG111", module.components["scales"],
                           f"{scales.size} scales for {out_features} output rows, or NaN/infinite ones")
    weight = read(module.payload)
    if weight.dtype != np.int8:
        raise DequantError("CG112", module.payload, f"EETQ weight stored as {weight.dtype}, not int8")
    out = np.empty((out_features, in_features), np.float32)
    for rows in row_bands(out_features, in_features):
        out[rows] = weight[:, rows].T.astype(np.float32) * scales[rows, None]
    return {module.weight: out}
