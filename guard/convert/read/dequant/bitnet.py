"""BitNet b1.58 (transformers ``integrations/bitnet.py``): ternary weights, four a byte, and one scale.

``unpack_weights``: row block ``k`` of the ``[out, in]`` weight sits in bits ``2k..2k+1`` of the packed
``[out/4, in]`` bytes, stored plus one.  ``BitLinear`` (``linear_class`` bitlinear) divides its output by
``weight_scale``, ``AutoBitLinear`` (autobitlinear, offline) multiplies it, so the equivalent full-precision
weight is ``q / weight_scale`` or ``q * weight_scale``.  The copy is the weights alone: BitNet's activation
quantization is a property of its layers, not of the checkpoint, and does not come along.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read, row_bands

if TYPE_CHECKING:
    import numpy as np


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    shape = read.info(module.payload).shape
    if len(shape) != 2:
        raise DequantError("CG111", module.payload, f"BitNet weight {list(shape)} is not a matrix")
    return {module.weight: (shape[0] * 4, shape[1])}


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    import numpy as np

    out_features, in_features = outputs(module, quant, read)[module.weight]
    scale = read(module.components["scales"]).astype(np.float32).reshape(-1)
    if scale.size != 1 or not np.isfinite(scale).all() or scale[0] == 0:
        raise DequantError("CG205", module.components["scales"], "BitNet weight_scale must be one finite, "
                                                                "non-zero value")
    divide = str(quant.params.get("linear_class", "bitlinear")).lower() != "autobitlinear"
    packed = read(module.payload)
    if packed.dtype != np.uint8:
        raise DequantError("CG112", module.payload, f"BitNet weight stored as {packed.dtype}, not uint8")
    step = packed.shape[0]
    out = np.empty((out_features, in_features), np.float32)
    for rows in row_bands(out_features, in_features):
        index = np.arange(rows.start, rows.stop)
        q = ((packed[index % step] >> (2 * (index // step)).astype(np.uint8)[:, None]) & 3).astype(np.float32) - 1
        out[rows] = q / scale[0] if divide else q * scale[0]
    return {module.weight: out}
