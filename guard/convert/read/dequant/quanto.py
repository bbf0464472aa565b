"""optimum-quanto (0.2.7): ``QBytesTensor`` (int8, float8) and ``QBitsTensor`` (int4, int2).

* qbytes: ``W = _scale * _data`` (a float8 payload upcast to the scale's dtype first), scale per output row.
* qbits: ``_data._data`` packs the grouped weight ``[numel / group, group]`` along its rows: row block
  ``k`` of the unpacked rows sits ``bits * k`` bits up (quanto's ``pack_weights``), trimmed to the group
  count; ``W = _scale * q - _shift`` (a float shift is already scaled; an integer one is subtracted
  first), ungrouped row-major (weights are grouped on axis 0).  The ``[out, in]`` shape is not stored:
  ``shapes.config_shape`` reads it from config.json through the pipeline.
quanto computes in the scale's dtype (bf16: a rounding per operation); float32 here, rounded once, except for
the product a float shift is subtracted from, which is rounded to the scale's dtype as quanto rounds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read, is_floating, row_bands

if TYPE_CHECKING:
    import numpy as np


def _qbits(module: Any) -> bool:
    return module.payload.endswith("._data._data")


def _bits(module: Any, quant: Any) -> int:
    fmt = module.format or quant.format or ""
    bits = {"qint2": 2, "qint4": 4}.get(fmt, module.bits or quant.bits)
    if bits not in (2, 4):
        raise DequantError("CG111", module.payload, f"packed quanto weight declared {fmt or bits!r}, not qint2/qint4")
    return int(bits)


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...] | None]:
    return {module.weight: _shape(module, read)}


def _shape(module: Any, read: Read) -> tuple[int, ...] | None:
    if module.logical_shape is not None or not _qbits(module) or "scales" not in module.components:
        return module.logical_shape
    from guard.convert.read.dequant.shapes import config_shape

    payload, scale = read.info(module.payload), read.info(module.components["scales"])
    numel = scale.shape[0] * payload.shape[-1] if scale.shape and payload.shape else 0
    return config_shape(module.weight, read.config, numel)


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    import numpy as np

    scale_name = module.components.get("scales")
    if scale_name is None:
        raise DequantError("CG110", module.payload, "quanto weight without its _scale")
    scale = read(scale_name)
    stored = scale.dtype
    scale = scale.astype(np.float32)
    if not np.isfinite(scale).all():
        raise DequantError("CG205", scale_name, "quanto scale holds NaN or infinite values")
    data = read(module.payload)
    if not _qbits(module):
        out = np.empty(data.shape, np.float32)
        rows_scale = scale.reshape(-1, *([1] * (data.ndim - 1))) if scale.size == data.shape[0] else scale
        for rows in row_bands(data.shape[0], data.size // max(1, data.shape[0])):
            s = rows_scale[rows] if rows_scale.ndim and rows_scale.shape[0] == data.shape[0] else rows_scale
            np.multiply(s, data[rows].astype(np.float32), out=out[rows])
        return {module.weight: out}
    bits = _bits(module, quant)
    groups = scale.shape[0]
    per = 8 // bits
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[0] * per < groups or scale.ndim != 2:
        raise DequantError("CG111", module.payload, f"quanto packed data {list(data.shape)} {data.dtype} does not "
                                                    f"hold {groups} groups at {bits} bits")
    group = data.shape[1]
    shift_name = module.components.get("zeros")
    shift = read(shift_name) if shift_name is not None else None
    if shift is not None and is_floating(shift):
        shift = shift.astype(np.float32)
        if not np.isfinite(shift).all():
            raise DequantError("CG205", shift_name, "quanto shift holds NaN or infinite values")
    shape = _shape(module, read)
    if shape is None or int(np.prod(shape)) != groups * group:
        raise DequantError("CG111", module.payload, f"{groups} groups of {group} do not make the weight "
                                                    f"{list(shape) if shape else '(shape unknown)'}")
    out = np.empty((groups, group), np.float32)
    step, mask = data.shape[0], (1 << bits) - 1
    for rows in row_bands(groups, group):
        index = np.arange(rows.start, rows.stop)
        codes = (data[index % step] >> (bits * (index // step)).astype(np.uint8)[:, None]) & mask
        if shift is not None and not is_floating(shift):
            values = (codes.astype(np.int16) - shift[rows].astype(np.int16)).astype(np.float32) * scale[rows]
        else:
            values = scale[rows] * codes.astype(np.float32)
            if shift is not None:
                # quanto rounds the product to the scale's dtype before the shift comes off; near zero the
                # difference cancels, so that rounding is kept (one step of bf16 there is many of the result)
                values = values.astype(stored).astype(np.float32) - shift[rows]
        out[rows] = values
    return {module.weight: out.reshape(shape)}
