"""HQQ (hqq 0.2.8 ``HQQLinear.state_dict``): ``W = (unpack(W_q) - zero) * scale``, reshaped to ``shape``.

The module carries its own record as small tensors (``shape``, ``nbits``, ``group_size``, ``axis``,
``packing`` and ``compute_dtype`` as strings, flags).  ``W_q`` is packed along its first dimension in
``1/pack`` slices (``4bit_u8``: the high nibbles hold the first half of the rows), so unpacking is a
concatenation of shifted copies; ``3bit_32`` packs ten 3-bit values an int32 and pads to a multiple of
ten rows.  hqq computes in its compute dtype (two roundings); here the arithmetic is float32 and the
pipeline rounds once, which agrees with hqq's own ``Quantizer.dequantize`` within one step of the dtype.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read, row_bands

if TYPE_CHECKING:
    import numpy as np

# packing -> (bits a value, values a stored element, the stored integer dtype)
PACKINGS = {"8bit_u8": (8, 1, "uint8"), "4bit_u8": (4, 2, "uint8"), "2bit_u8": (2, 4, "uint8"),
            "1bit_u8": (1, 8, "uint8"), "3bit_32": (3, 10, "int32")}


def _meta(module: Any, read: Read, key: str) -> Any:
    name = module.components.get("meta:" + key)
    if name is None:
        raise DequantError("CG110", module.payload, f"HQQ weight without its {key!r} record tensor")
    return read(name)


def _text(module: Any, read: Read, key: str) -> str:
    try:
        return bytes(_meta(module, read, key).reshape(-1).view("uint8")).decode("ascii")
    except UnicodeDecodeError:
        raise DequantError("CG111", module.components["meta:" + key], f"HQQ {key} record is not text") from None


def _int(module: Any, read: Read, key: str) -> int:
    return int(_meta(module, read, key).reshape(-1)[0])


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    shape = tuple(int(d) for d in _meta(module, read, "shape").reshape(-1))
    if not shape or any(d <= 0 for d in shape):
        raise DequantError("CG111", module.components["meta:shape"], f"HQQ shape record {list(shape)}")
    return {module.weight: shape}


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    import numpy as np

    shape = outputs(module, quant, read)[module.weight]
    packing = _text(module, read, "packing")
    if packing not in PACKINGS:
        raise DequantError("CG112", module.components["meta:packing"], f"unknown HQQ packing {packing!r}")
    bits, per, stored = PACKINGS[packing]
    if _int(module, read, "nbits") != bits:
        raise DequantError("CG111", module.components["meta:nbits"], f"HQQ nbits says "
                                                                    f"{_int(module, read, 'nbits')}, packing {packing}")
    for flag in ("quant_scale", "quant_zero"):
        if flag in {k[5:] for k in module.components if k.startswith("meta:")} and _int(module, read, flag):
            raise DequantError("CG112", module.components["meta:" + flag], "HQQ's quantized scale/zero meta "
                                                                           "(quant_scale/quant_zero) is not read")
    w_q = read(module.payload)
    if w_q.ndim != 2 or (w_q.shape[1] * w_q.dtype.itemsize) % np.dtype(stored).itemsize:
        raise DequantError("CG111", module.payload, f"HQQ payload {list(w_q.shape)} is not a matrix of {stored}")
    w_q = np.ascontiguousarray(w_q).view(stored)  # view_as_float stores the integers under a float dtype
    if w_q.ndim != 2:
        raise DequantError("CG111", module.payload, f"HQQ payload is not a 2-D {stored} matrix for {packing}")
    scale = read(module.components["scales"]).astype(np.float32)
    zero = read(module.components["zeros"]).astype(np.float32)
    n = prod(shape)
    group_rows, cols = _grouped(scale, zero, n, module)
    if w_q.shape[1] != cols or w_q.shape[0] * per < group_rows:
        raise DequantError("CG111", module.payload, f"HQQ payload {list(w_q.shape)} cannot hold a {group_rows}x{cols} "
                                                    f"grouped weight at {bits} bits")
    for name, values in ((module.components["scales"], scale), (module.components["zeros"], zero)):
        if not np.isfinite(values).all():
            raise DequantError("CG205", name, "HQQ scale or zero holds NaN or infinite values")
    out = np.empty((group_rows, cols), np.float32)
    step = w_q.shape[0]
    mask = (1 << bits) - 1
    for rows in row_bands(group_rows, cols):
        # packed row r % step, slice r // step: slice k sits ``bits * (per - 1 - k)`` bits up
        index = np.arange(rows.start, rows.stop)
        shifts = (bits * (per - 1 - index // step)).astype(stored)[:, None]
        codes = ((w_q[index % step] >> shifts) & mask).astype(np.float32)
        z = zero if zero.shape[0] == 1 else zero[rows]
        s = scale if scale.shape[0] == 1 else scale[rows]
        out[rows] = (codes - z) * s
    return {module.weight: out.reshape(shape)}


def _grouped(scale: np.ndarray, zero: np.ndarray, n: int, module: Any) -> tuple[int, int]:
    """The grouped matrix's shape: axis 1 groups rows (scale [groups, 1]), axis 0 columns (scale [1, groups])."""
    if scale.ndim != 2 or scale.shape != zero.shape or 1 not in scale.shape:
        raise DequantError("CG111", module.components["scales"], f"HQQ scale {list(scale.shape)} and zero "
                                                                f"{list(zero.shape)} are not one per group")
    if scale.shape[1] == 1:  # axis=1: [n / group, group]
        rows = scale.shape[0]
        return rows, n // rows
    cols = scale.shape[1]
    return n // cols, cols
