"""compressed-tensors: pack-, int-, float-, naive-, nvfp4-/mxfp4-pack- and mxfp8-quantized weights back to floats.

The reference is compressed-tensors' own compressors (``compressors/pack_quantized``,
``naive_quantized``, ``nvfp4``) and ``quantization.lifecycle.forward.dequantize``:

- ``pack-quantized``: ``weight_packed`` I32 holds ``num_bits``-wide codes as one dense little-endian
  bit stream per row (element i at bit i*num_bits; 4- and 8-bit never straddle a word), stored
  offset by 2^(bits-1); an asymmetric ``weight_zero_point`` is packed the same way along dim 0.
  ``weight_shape`` holds the logical shape.
- ``int-/float-/naive-quantized``: ``weight`` is I8 / F8 holding the codes themselves.
- ``nvfp4-pack-quantized``: ``weight_packed`` U8 holds two FP4 E2M1 codes a byte (low nibble
  first), ``weight_scale`` is F8_E4M3 per 16 columns, divided by the F32 ``weight_global_scale``.
- ``mxfp4-pack-quantized`` / ``mxfp8-quantized``: the same FP4 packing / F8 codes, groups of 32 sharing a
  U8 E8M0 ``weight_scale`` (``2^(byte - 127)``, ``compressors/mx_utils.py``).

``w = (q - zero_point) * scale``, with the scale broadcast per tensor, row, group of columns
(``weight_g_idx`` maps each column to its group when activation ordering permuted them) or
2-D block (DeepSeek-style FP8 blocks; ragged edge blocks are cut to the weight).  The strategy
is read from the scale's shape, the bit width from the packed width, so a header-only inventory
needs no config group to match each module's class name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read, row_bands
from guard.findings import shown

if TYPE_CHECKING:
    import numpy as np

# Threads per tensor: each holds one band of temporaries (BAND_ELEMENTS), so the peak grows by a few bands.
WORKERS = min(4, os.cpu_count() or 1)
# E2M1 code -> value; bit 3 is the sign (compressed-tensors ``kE2M1ToFloat``, transformers ``FP4_VALUES``).
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def stored_names(module: Any) -> set[str]:
    return {module.payload, *module.components.values()}


def optional(read: Read, name: str, names: set[str]) -> np.ndarray | None:
    """A companion the scheme may leave out: read when the module lists it, else tried by name."""
    if name in names:
        return read(name)
    try:
        return read(name)
    except KeyError:
        return None
    except DequantError as exc:
        if exc.code != "CG110":  # absent is fine; unreadable is not
            raise
        return None


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    name = f"{module.prefix}.weight"
    if not module.payload.endswith(".weight_packed"):  # int/float/naive: the codes have the weight's shape
        return {name: tuple(module.logical_shape or read(module.payload).shape)}
    stored = optional(read, f"{module.prefix}.weight_shape", stored_names(module))
    if stored is not None:
        return {name: tuple(int(v) for v in stored.reshape(-1))}
    if module.logical_shape:
        return {name: tuple(module.logical_shape)}
    packed = read(module.payload)  # nvfp4: two codes a byte
    return {name: (*packed.shape[:-1], packed.shape[-1] * 2)}


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    import numpy as np

    prefix, names = module.prefix, stored_names(module)
    scale_name = f"{prefix}.weight_scale"
    scale = read(scale_name)
    if scale.dtype.itemsize == 1 and scale.dtype.kind in "uV" and scale.dtype.name != "float8_e4m3fn":
        # mxfp4-pack-quantized / mxfp8-quantized: E8M0 exponents, 2^(byte - 127) (compressors/mx_utils.py)
        scale = np.ldexp(np.float32(1), scale.view(np.uint8).astype(np.int32) - 127).astype(np.float32)
    else:
        scale = scale.astype(np.float32)
    decode: Callable[[np.ndarray], np.ndarray] | None  # (declared for the type checker: never evaluated)
    width: int | None
    decode, width = None, None  # packed payloads are decoded band by band inside affine()
    if f"{prefix}.weight_packed" in names or module.payload.endswith(".weight_packed"):
        codes = read(f"{prefix}.weight_packed")
        if codes.dtype == np.uint8:  # nvfp4-/mxfp4-pack-quantized (the int formats pack into I32)
            decode, width = fp4_values, codes.shape[-1] * 2
            global_scale = optional(read, f"{prefix}.weight_global_scale", names)
            if global_scale is not None:
                # compressed-tensors computes scale / global_scale in float32 before the product
                scale = scale / np.float32(global_scale.astype(np.float32).reshape(-1)[0])
            shape = (*codes.shape[:-1], width)
            zero = None
        else:
            shape = _logical_shape(module, read)
            bits = packed_bits(codes.shape[-1], shape[-1], module)
            offset = np.float32(1 << (bits - 1))  # codes are stored offset by 2^(bits-1): folded into the zero
            decode, width = _unpacker(bits, shape[-1]), shape[-1]
            zero = optional(read, f"{prefix}.weight_zero_point", names)
            if zero is not None and zero.dtype == np.int32 and zero.shape != scale.shape:  # packed along dim 0
                zero = unpack_dense(np.ascontiguousarray(zero.view(np.uint32).T), bits, scale.shape[0]).T
                zero = zero.astype(np.float32) - offset
            zero = np.full(scale.shape, offset, np.float32) if zero is None else zero.astype(np.float32) + offset
    else:
        codes = read(f"{prefix}.weight")
        shape = codes.shape
        zero = optional(read, f"{prefix}.weight_zero_point", names)
    if zero is not None:
        zero = zero.astype(np.float32)
    g_idx = optional(read, f"{prefix}.weight_g_idx", names)
    out = affine(codes, scale, zero, g_idx=g_idx, block=_block(quant), name=scale_name, decode=decode, width=width)
    if out.shape != tuple(shape):
        raise DequantError("CG111", module.payload, f"dequantized to {list(out.shape)}, declared {list(shape)}")
    return {f"{prefix}.weight": out}


def affine(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, *,
           g_idx: np.ndarray | None = None, block: tuple[int, int] | None = None, name: str = "scale",
           decode: Callable[[np.ndarray], np.ndarray] | None = None, width: int | None = None) -> np.ndarray:
    """float32 ``(codes - zero) * scale`` with the scale's layout read from its shape, band by band.

    ``decode`` turns a band of stored rows (packed words, FP4 bytes) into ``width`` codes a row, so a packed
    payload is never unpacked whole: the float32 result is the only full-size array.
    """
    import numpy as np

    codes2 = codes.reshape(-1, codes.shape[-1]) if codes.ndim != 2 else codes
    rows, cols = codes2.shape[0], width or codes2.shape[1]
    require_finite(scale, name)
    scale2: np.ndarray  # its shape differs by branch (declared for the type checker: never evaluated)
    if scale.size == 1:  # per tensor
        scale2 = scale.reshape(())
    elif (block and scale.ndim == codes.ndim == 3 and scale.shape[0] == codes.shape[0]
          and codes.shape[1] % block[0] == 0):  # fused experts in blocks: each expert's block rows follow on
        scale2 = scale.reshape(-1, scale.shape[-1])
    elif scale.ndim != 2 and scale.size % rows == 0:  # per row stored 1-D, or experts stacked on dim 0
        scale2 = scale.reshape(rows, -1)
    else:
        scale2 = scale
    zero2 = None if zero is None else zero.reshape(scale2.shape)
    columns = _column_map(scale2, rows, cols, g_idx, block, name)
    per_row = scale2.ndim == 2 and scale2.shape[0] == rows
    # groups of whole columns in order: the band is viewed as [rows, groups, group] and the scales
    # broadcast over the last axis, so no expanded copy of the scales is ever made
    grouped = per_row and columns is not None and g_idx is None and cols % scale2.shape[1] == 0
    out = np.empty((rows, cols), dtype=np.float32)

    def fill(band: slice) -> None:
        target = out[band]
        stored = codes2[band] if decode is None else decode(codes2[band])
        np.copyto(target, stored, casting="unsafe")  # the one conversion, straight into the output
        if scale2.ndim == 0:
            s, z = scale2, zero2
        else:
            s_rows = band if per_row else _row_map(scale2, rows, band, block)[:1]  # a block band: one scale row
            s = scale2[s_rows]
            z = None if zero2 is None else zero2[s_rows]
        if grouped:
            view = target.reshape(target.shape[0], scale2.shape[1], -1)
            if z is not None:
                view -= z[..., None]
            view *= s[..., None]
            return
        if columns is not None:
            s = s[:, columns]
            z = None if z is None else z[:, columns]
        if z is not None:
            target -= z
        target *= s

    bands = list(_bands(rows, cols, scale2, block))
    if len(bands) < 2 or WORKERS < 2:
        for band in bands:
            fill(band)
    else:  # numpy releases the GIL in these casts and products: bands (disjoint rows of out) on a few threads
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(fill, bands))
    return out.reshape(*codes.shape[:-1], cols)


def _bands(rows: int, cols: int, scale: np.ndarray, block: tuple[int, int] | None) -> Iterator[slice]:
    """Row bands; under 2-D blocks, one band per row of blocks, so each band reads one row of scales."""
    if scale.ndim == 2 and 1 < scale.shape[0] != rows:
        height = block[0] if block is not None else -(-rows // scale.shape[0])
        for start in range(0, rows, height):
            yield slice(start, min(rows, start + height))
    else:
        yield from row_bands(rows, cols)


def require_finite(scale: np.ndarray, name: str) -> None:
    """A NaN or Inf scale makes every weight it scales NaN/Inf: refused (CG205), never written."""
    import numpy as np

    bad = int(scale.size - np.count_nonzero(np.isfinite(scale)))
    if bad:
        raise DequantError("CG205", name, f"{shown(name)} holds {bad:,} NaN/Inf scale value(s): the weights "
                           "they scale would be garbage")


def _column_map(scale: np.ndarray, rows: int, cols: int, g_idx: np.ndarray | None,
                block: tuple[int, int] | None, name: str) -> np.ndarray | None:
    """Which scale column each weight column reads (None: one scale column broadcast to all)."""
    import numpy as np

    if scale.ndim == 0 or scale.size == 1 or scale.shape[-1] == 1:
        return None
    width = scale.shape[-1]
    if g_idx is not None:
        if g_idx.shape != (cols,) or g_idx.min(initial=0) < 0 or g_idx.max(initial=0) >= width:
            raise DequantError("CG111", name, f"g_idx of shape {list(g_idx.shape)} does not map {cols} columns "
                               f"to {width} scale groups")
        return g_idx.astype(np.intp)
    if scale.shape[0] == rows or block is None:  # groups along the columns
        group = -(-cols // width)
        if block is not None:
            group = block[1]
        if -(-cols // group) != width:
            raise DequantError("CG111", name, f"{width} scale columns do not cover {cols} columns")
        return np.arange(cols) // group
    if -(-cols // block[1]) != width:
        raise DequantError("CG111", name, f"{width} scale columns do not cover {cols} columns in blocks of {block[1]}")
    return np.arange(cols) // block[1]


def _row_map(scale: np.ndarray, rows: int, band: slice, block: tuple[int, int] | None) -> Any:
    import numpy as np

    if scale.ndim == 0:
        return Ellipsis
    if scale.shape[0] == rows:
        return band
    height = block[0] if block is not None else -(-rows // scale.shape[0])
    if -(-rows // height) != scale.shape[0]:
        raise DequantError("CG111", "scale", f"{scale.shape[0]} scale rows do not cover {rows} rows")
    return np.arange(band.start, band.stop) // height


def _block(quant: Any) -> tuple[int, int] | None:
    """The weights' ``block_structure`` from the first config group that declares one."""
    params = getattr(quant, "params", None) or {}
    for group in (params.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        block = weights.get("block_structure") if isinstance(weights, dict) else None
        if isinstance(block, (list, tuple)) and len(block) == 2:
            return int(block[0]), int(block[1])
    return None


def _logical_shape(module: Any, read: Read) -> tuple[int, ...]:
    names = stored_names(module)
    shape_name = f"{module.prefix}.weight_shape"
    stored = optional(read, shape_name, names)
    if stored is not None:
        return tuple(int(v) for v in stored.reshape(-1))
    if module.logical_shape:
        return tuple(module.logical_shape)
    raise DequantError("CG110", shape_name, "packed weight without its weight_shape")


def _unpacker(bits: int, count: int) -> Callable[[np.ndarray], np.ndarray]:
    import numpy as np

    return lambda words: unpack_dense(words.view(np.uint32), bits, count)


def packed_bits(words: int, columns: int, module: Any) -> int:
    """Bits per code from the packed width: ``words == ceil(columns * bits / 32)``."""
    for bits in (4, 8, 2, 3, 5, 6, 7, 1):
        if -(-columns * bits // 32) == words:
            return bits
    raise DequantError("CG111", module.payload, f"{words} packed words per row fit no bit width for "
                       f"{columns} columns")


def unpack_dense(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint32 rows holding ``bits``-wide codes as one little-endian bit stream -> uint8 [rows, count]."""
    import numpy as np

    rows = words.reshape(-1, words.shape[-1])
    as_bytes = rows.astype("<u4", copy=False).view(np.uint8)
    if bits == 8:
        return as_bytes[:, :count].reshape(*words.shape[:-1], count)
    if bits == 4:
        out = np.empty((rows.shape[0], as_bytes.shape[1] * 2), dtype=np.uint8)
        np.bitwise_and(as_bytes, 0x0F, out=out[:, 0::2])
        np.right_shift(as_bytes, 4, out=out[:, 1::2])
        return out[:, :count].reshape(*words.shape[:-1], count)
    stream = np.unpackbits(as_bytes, axis=1, bitorder="little")[:, : count * bits]
    weights = (1 << np.arange(bits, dtype=np.uint16)).astype(np.uint16)
    codes = stream.reshape(rows.shape[0], count, bits).astype(np.uint16) @ weights
    return codes.astype(np.uint8).reshape(*words.shape[:-1], count)


def fp4_values(packed: np.ndarray) -> np.ndarray:
    """U8 [..., n] of two E2M1 codes a byte, low nibble first -> float32 [..., 2n]."""
    import numpy as np

    table = np.array(FP4_E2M1, dtype=np.float32)
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=np.float32)
    out[..., 0::2] = table[packed & 0x0F]
    out[..., 1::2] = table[packed >> 4]
    return out
