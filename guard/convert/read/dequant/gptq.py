"""GPTQ (AutoGPTQ / gptqmodel ``QuantLinear``): ``W[i, o] = scales[g, o] * (q[i, o] - z[g, o])``, ``g = g_idx[i]``.

``qweight`` ``[in·bits/32, out]`` packs along the input axis, ``qzeros`` ``[groups, out·bits/32]`` along the
output axis, each int32 read as a little-endian bit stream: value ``k`` of a run is bits ``[k·bits, (k+1)·bits)``
(for 3 bits, 32 values span three int32s and cross their boundaries, as AutoGPTQ's ``wf`` table unpacks
them).  ``checkpoint_format`` gptq (v1, AutoGPTQ) stores zero points minus one, so one is added back;
gptq_v2 (gptqmodel) stores them as they are.  Without ``g_idx`` (or where it is sequential) row ``i`` is in
group ``i // group_size``; with ``desc_act`` it is ``g_idx[i]``.  The result is the Linear weight ``[out, in]``,
made in bands of output rows so only the float32 result is full-size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read, row_bands

if TYPE_CHECKING:
    import numpy as np

BITS = (2, 3, 4, 8)


def unpack_int32(packed: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Unsigned ``bits``-wide values of an int32 array read as a bit stream along ``axis`` (low bits first)."""
    import numpy as np

    words = np.moveaxis(np.ascontiguousarray(packed).view(np.uint32), axis, 0)
    mask = np.uint64((1 << bits) - 1)
    if 32 % bits == 0:
        per = 32 // bits
        shifts = (np.arange(per, dtype=np.uint32) * bits).reshape(1, per, *([1] * (words.ndim - 1)))
        values = (words[:, None] >> shifts) & np.uint32(mask)
        values = values.reshape(words.shape[0] * per, *words.shape[1:])
    else:  # 3 bits: 32 values in every 3 words
        runs = words.reshape(words.shape[0] // 3, 3, *words.shape[1:]).astype(np.uint64)
        out = []
        for k in range(32):
            word, offset = divmod(k * bits, 32)
            value = runs[:, word] >> np.uint64(offset)
            if offset + bits > 32:
                value |= runs[:, word + 1] << np.uint64(32 - offset)
            out.append(value & mask)
        values = np.stack(out, axis=1).reshape(words.shape[0] // 3 * 32, *words.shape[1:])
    return np.moveaxis(values.astype(np.int32), 0, axis)


def _bits(module: Any, quant: Any) -> int:
    bits = module.bits or quant.bits
    if bits not in BITS:
        raise DequantError("CG111", module.payload, f"GPTQ declares {bits} bits; AutoGPTQ packs 2, 3, 4 or 8")
    return int(bits)


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    qweight = read.info(module.payload)
    bits = _bits(module, quant)
    if len(qweight.shape) != 2 or (qweight.shape[0] * 32) % bits:
        raise DequantError("CG111", module.payload, f"GPTQ qweight {list(qweight.shape)} is not [in·{bits}/32, out]")
    return {module.weight: (qweight.shape[1], qweight.shape[0] * 32 // bits)}


def group_index(module: Any, quant: Any, read: Read, rows: int, groups: int) -> np.ndarray:
    """Each input row's group: ``g_idx`` where stored, else consecutive runs of ``group_size``."""
    import numpy as np

    name = module.components.get("g_idx")
    if name is not None:
        g_idx = read(name).astype(np.int64).reshape(-1)
        if g_idx.size != rows or (g_idx.size and (g_idx.min() < 0 or g_idx.max() >= groups)):
            raise DequantError("CG111", name, f"g_idx holds {g_idx.size} rows for {rows}, or a group outside "
                                              f"0..{groups - 1}")
        return g_idx
    size = module.group_size or quant.group_size
    size = rows if size in (None, -1, 0) else int(size)
    if -(-rows // size) != groups:
        raise DequantError("CG111", module.payload, f"{rows} input rows in groups of {size} make "
                                                    f"{-(-rows // size)} groups, the scales hold {groups}")
    return np.arange(rows) // size


def dequantize(module: Any, quant: Any, read: Read, *, zero_offset: int | None = None) -> dict[str, np.ndarray]:
    import numpy as np

    bits = _bits(module, quant)
    out_features, in_features = outputs(module, quant, read)[module.weight]
    scales = read(module.components["scales"]).astype(np.float32)
    if not np.isfinite(scales).all():
        raise DequantError("CG205", module.components["scales"], "GPTQ scales hold NaN or infinite values")
    if scales.ndim != 2 or scales.shape[1] != out_features:
        raise DequantError("CG111", module.components["scales"], f"scales {list(scales.shape)} for a "
                                                                f"{out_features}-column qweight")
    zeros = unpack_int32(read(module.components["zeros"]), bits, axis=1)
    if zeros.shape != scales.shape:
        raise DequantError("CG111", module.components["zeros"], f"qzeros unpack to {list(zeros.shape)}, the "
                                                               f"scales are {list(scales.shape)}")
    v1 = (module.format or quant.format or "gptq") != "gptq_v2"
    zeros = zeros + (1 if v1 else 0) if zero_offset is None else zeros + zero_offset
    g_idx = group_index(module, quant, read, in_features, scales.shape[0])
    qweight = read(module.payload)
    out = np.empty((out_features, in_features), np.float32)
    for cols in row_bands(out_features, in_features):
        q = unpack_int32(qweight[:, cols], bits, axis=0)  # [in, band]
        w = (q - zeros[g_idx, cols]).astype(np.float32) * scales[g_idx, cols]
        out[cols] = w.T
    return {module.weight: out}
