"""AWQ (AutoAWQ): ``W[i, o] = (q[i, o] - z[i // g, o]) * scales[i // g, o]``, as AutoAWQ's ``dequantize_gemm``.

* gemm (``version`` gemm, the default): ``qweight`` ``[in, out/8]`` and ``qzeros`` ``[groups, out/8]`` pack 8
  nibbles an int32 along the output axis in AWQ's order 0,2,4,6,1,3,5,7: nibble ``k`` holds column
  ``ORDER[k]`` of its eight, so unpacking indexes with the inverse order 0,4,1,5,2,6,3,7.
* gemv: ``qweight`` ``[out, in/8]`` packs along the input axis in plain order; ``qzeros`` ``[out, ·]`` and
  ``scales`` ``[out, ·]`` are padded to a multiple of 8 groups, of which the first ``in / g`` count.
The result is the Linear weight ``[out, in]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read, row_bands
from guard.convert.read.dequant.gptq import unpack_int32

if TYPE_CHECKING:
    import numpy as np

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
INVERSE = (0, 4, 1, 5, 2, 6, 3, 7)


def _gemv(module: Any, quant: Any) -> bool:
    return str(module.format or quant.format or "gemm").lower() == "gemv"


def _check_bits(module: Any, quant: Any) -> None:
    bits = module.bits or quant.bits or 4
    if bits != 4:
        raise DequantError("CG111", module.payload, f"AWQ declares {bits} bits; AutoAWQ packs 4")


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    _check_bits(module, quant)
    shape = read.info(module.payload).shape
    if len(shape) != 2:
        raise DequantError("CG111", module.payload, f"AWQ qweight {list(shape)} is not a matrix")
    if _gemv(module, quant):
        return {module.weight: (shape[0], shape[1] * 8)}
    return {module.weight: (shape[1] * 8, shape[0])}


def _unordered(packed: np.ndarray) -> np.ndarray:
    """gemm's nibbles back in column order (along the last axis)."""
    import numpy as np

    values = unpack_int32(packed, 4, axis=packed.ndim - 1)
    order = (np.arange(values.shape[-1]).reshape(-1, 8)[:, list(INVERSE)]).reshape(-1)
    return values[..., order]


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    import numpy as np

    out_features, in_features = outputs(module, quant, read)[module.weight]
    scales = read(module.components["scales"]).astype(np.float32)
    if not np.isfinite(scales).all():
        raise DequantError("CG205", module.components["scales"], "AWQ scales hold NaN or infinite values")
    qzeros = read(module.components["zeros"])
    qweight = read(module.payload)
    out = np.empty((out_features, in_features), np.float32)
    size = module.group_size or quant.group_size
    size = in_features if size in (None, -1, 0) else int(size)
    groups = -(-in_features // size)
    if _gemv(module, quant):
        zeros = unpack_int32(qzeros, 4, axis=1)
        if scales.shape[0] != out_features or scales.shape[1] < groups or zeros.shape[1] < groups:
            raise DequantError("CG111", module.components["scales"], f"gemv scales {list(scales.shape)} for "
                                                                    f"{out_features} rows of {groups} groups")
        group_of = np.arange(in_features) // size
        for rows in row_bands(out_features, in_features):
            q = unpack_int32(qweight[rows], 4, axis=1)
            out[rows] = (q - zeros[rows][:, group_of]).astype(np.float32) * scales[rows][:, group_of]
        return {module.weight: out}
    zeros = _unordered(qzeros)
    if scales.shape != (groups, out_features) or zeros.shape != scales.shape:
        raise DequantError("CG111", module.components["scales"], f"scales {list(scales.shape)} and zeros "
                                                                f"{list(zeros.shape)}, expected [{groups}, "
                                                                f"{out_features}] for groups of {size}")
    group_of = np.arange(in_features) // size
    for band in row_bands(out_features // 8, in_features * 8):
        cols = slice(band.start * 8, band.stop * 8)
        q = _unordered(qweight[:, band])  # [in, 8·band]
        w = (q - zeros[group_of, cols]).astype(np.float32) * scales[group_of, cols]
        out[cols] = w.T
    return {module.weight: out}
