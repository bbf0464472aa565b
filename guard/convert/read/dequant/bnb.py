"""bitsandbytes: 4-bit (nf4/fp4, double quant, any quant_storage) and 8-bit (row-wise int8 with SCB).

The arithmetic is bitsandbytes' own CPU reference (``backends/default/ops.py`` and ``_ops.py``, 0.50),
in float32 in the same order, so the result is bit-identical before the pipeline's one rounding:

* 4-bit: ``code[nibble] * absmax[block]``, high nibble first, over blocks of ``blocksize`` flat elements.
  The code table is bitsandbytes' built-in one for the quant type (its kernels never read the stored
  ``quant_map``).  With double quant, ``absmax`` is itself 8-bit blockwise: ``nested_quant_map[byte] *
  nested_absmax[block] + nested_offset``.
* 8-bit: ``weight * SCB[row] * (1/127)``.
"""

from __future__ import annotations

import json
from math import prod
from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import BAND_ELEMENTS, DequantError, Read, row_bands

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

# bitsandbytes.functional.get_4bit_type: nf4 as listed; fp4 normalised by its largest magnitude (12)
_NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
        -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
        0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
        0.7229568362236023, 1.0)
_FP4 = (0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0)
_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


def code_table(quant_type: str) -> np.ndarray:
    import numpy as np

    if quant_type == "nf4":
        return np.array(_NF4, np.float32)
    table = np.array(_FP4, np.float32)
    return table / np.float32(12.0)


def quant_state(module: Any, read: Callable[[str], np.ndarray]) -> dict[str, Any]:  # a Read, or one blob's reader
    """The JSON blob bitsandbytes packs the 4-bit state's scalars into (shape, blocksize, quant type, ...)."""
    name = module.components.get("quant_state")
    if name is None:
        raise DequantError("CG110", module.payload, "4-bit weight without its quant_state.bitsandbytes__nf4/fp4 "
                                                    "record (shape and block size)")
    try:
        state = json.loads(bytes(read(name).reshape(-1).view("uint8")).decode("utf-8"))
        shape = tuple(int(d) for d in state["shape"])
        blocksize = int(state["blocksize"])
        quant_type = state["quant_type"]
        if "nested_blocksize" in state or "nested_offset" in state:
            state["nested_blocksize"] = int(state["nested_blocksize"])
            state["nested_offset"] = float(state["nested_offset"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise DequantError("CG110", name, f"unreadable bitsandbytes quant_state record ({type(exc).__name__}: "
                                          f"{str(exc)[:80]})") from None
    if quant_type not in ("nf4", "fp4") or blocksize not in _BLOCKSIZES or any(d < 0 for d in shape):
        raise DequantError("CG111", name, f"quant_state declares quant_type {quant_type!r}, blocksize {blocksize}, "
                                          f"shape {list(shape)}: not a bitsandbytes 4-bit layout")
    state.update(shape=shape, blocksize=blocksize)
    return state


def _is_8bit(module: Any) -> bool:
    return "SCB" in module.components


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    if _is_8bit(module):
        return {module.weight: tuple(module.logical_shape or ())}
    return {module.weight: quant_state(module, read)["shape"]}


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    if _is_8bit(module):
        return {module.weight: _int8(module, read)}
    return {module.weight: _four_bit(module, read)}


def elements(module: Any, quant: Any, read: Any, name: str, flat: list[int]) -> np.ndarray | None:
    """The read-back check's sampled elements of a 4-bit weight stored as uint8, recomputed from the source:
    each sampled element's byte read from the file, its nibble (high first) through the code table, times
    its block's absmax (double quant undone as in ``dequantize``): the same float32 product, one rounding.
    None (the whole module is dequantized again) for 8-bit and float ``quant_storage``."""
    import numpy as np

    if _is_8bit(module) or name != module.weight or not hasattr(read, "elements"):
        return None
    state = quant_state(module, read)
    shape, blocksize = state["shape"], state["blocksize"]
    n = prod(shape)
    info = read.info(module.payload)
    if info.dtype != "U8" or prod(info.shape) != (n + 1) // 2:
        return None
    absmax = _absmax(module, read, state, -(-n // blocksize))
    index = np.asarray(flat, dtype=np.intp)
    packed = read.elements(module.payload, [int(i) // 2 for i in flat]).view(np.uint8)
    nibble = np.where(index % 2 == 0, packed >> 4, packed & 0xF)
    return code_table(state["quant_type"])[nibble] * absmax[index // blocksize]


def _int8(module: Any, read: Read) -> np.ndarray:
    import numpy as np

    weight = read(module.payload)
    scb = read(module.components["SCB"]).astype(np.float32, copy=False).reshape(-1)
    if weight.dtype != np.int8 or weight.ndim != 2:
        raise DequantError("CG112", module.payload, f"8-bit bitsandbytes weight stored as {weight.dtype} "
                                                    f"{list(weight.shape)}, not an int8 matrix")
    if scb.shape[0] != weight.shape[0]:
        raise DequantError("CG111", module.components["SCB"], f"{scb.shape[0]} row scales for a weight of "
                                                              f"{weight.shape[0]} rows")
    _finite(scb, module.components["SCB"])
    out = np.empty(weight.shape, np.float32)
    for rows in row_bands(weight.shape[0], weight.shape[1]):
        band = weight[rows].astype(np.float32) * scb[rows, None]
        np.multiply(band, np.float32(7.874015718698502e-3), out=out[rows])
    return out


def _four_bit(module: Any, read: Read) -> np.ndarray:
    import numpy as np

    state = quant_state(module, read)
    shape, blocksize = state["shape"], state["blocksize"]
    n = prod(shape)
    packed = read(module.payload).reshape(-1).view(np.uint8)  # a float quant_storage holds the same bytes
    if packed.size != (n + 1) // 2:
        raise DequantError("CG111", module.payload, f"{packed.size} packed bytes for a {list(shape)} weight "
                                                    f"(4-bit needs {(n + 1) // 2})")
    absmax = _absmax(module, read, state, -(-n // blocksize))
    pairs, quads = _tables(state["quant_type"])
    out = np.empty(n + (n & 1), np.float32)
    band_blocks = max(1, BAND_ELEMENTS // blocksize)  # whole blocks (an even size keeps a byte's pair together)
    for first in range(0, absmax.size, band_blocks):
        start, stop = first * blocksize, min(n, (first + band_blocks) * blocksize)
        stop_even = stop + (stop & 1)
        # two bytes at a time through the 64 Ki-entry table; mode="clip": no bounds pass (every index is valid)
        first_byte, end_byte = start // 2, stop_even // 2
        whole_pairs = (end_byte - first_byte) // 2
        np.take(quads, packed[first_byte:first_byte + 2 * whole_pairs].view("<u2"),
                out=out[start:start + 4 * whole_pairs].view(np.complex128), mode="clip")
        if first_byte + 2 * whole_pairs < end_byte:  # an odd byte at the very end
            np.take(pairs, packed[end_byte - 1:end_byte], out=out[stop_even - 2:stop_even].view(np.uint64),
                    mode="clip")
        scales = absmax[first:first + band_blocks]
        whole = (stop - start) // blocksize
        band = out[start:start + whole * blocksize].reshape(whole, blocksize)
        np.multiply(band, scales[:whole, None], out=band)
        if start + whole * blocksize < stop:  # the last, partial block
            out[start + whole * blocksize:stop] *= scales[whole]
    out = out[:n]
    return out.reshape(shape)


_TABLES: dict[str, tuple[Any, Any]] = {}


def _tables(quant_type: str) -> tuple[np.ndarray, np.ndarray]:
    """A byte's two values as one 8-byte item, and two bytes' four as one 16-byte item (indexed by the
    little-endian uint16 of the pair): one gather per two bytes instead of nibble arrays."""
    import numpy as np

    if quant_type not in _TABLES:
        code = code_table(quant_type)
        byte = np.arange(256)
        pairs = np.stack([code[byte >> 4], code[byte & 0xF]], axis=1)  # [256, 2] float32
        word = np.arange(65536)
        quads = np.concatenate([pairs[word & 0xFF], pairs[word >> 8]], axis=1)  # [65536, 4] float32
        _TABLES[quant_type] = (np.ascontiguousarray(pairs).view(np.uint64).reshape(256),
                               np.ascontiguousarray(quads).view(np.complex128).reshape(65536))
    return _TABLES[quant_type]


def _absmax(module: Any, read: Read, state: dict[str, Any], blocks: int) -> np.ndarray:
    import numpy as np

    name = module.components.get("absmax")
    if name is None:
        raise DequantError("CG110", module.payload, "4-bit weight without its absmax")
    absmax = read(name).reshape(-1)
    if "nested_offset" in state:
        nested, nested_map = module.components.get("nested_absmax"), module.components.get("nested_quant_map")
        if nested is None or nested_map is None:
            raise DequantError("CG110", name, "double-quantized absmax without nested_absmax and nested_quant_map")
        nested_absmax = read(nested).astype(np.float32, copy=False).reshape(-1)
        table = read(nested_map).astype(np.float32, copy=False).reshape(-1)
        if absmax.dtype != np.uint8 or table.size != 256:
            raise DequantError("CG111", name, f"double-quantized absmax stored as {absmax.dtype} with a "
                                              f"{table.size}-entry map (bitsandbytes writes uint8 with 256)")
        size = state["nested_blocksize"]
        if size <= 0 or nested_absmax.size != -(-absmax.size // size):
            raise DequantError("CG111", nested, f"{nested_absmax.size} nested scales for {absmax.size} absmax "
                                                f"values in blocks of {size}")
        _finite(nested_absmax, nested)
        absmax = table[absmax] * np.repeat(nested_absmax, size)[:absmax.size]
        absmax += np.float32(state["nested_offset"])
    else:
        absmax = absmax.astype(np.float32, copy=False)
    if absmax.size != blocks:
        raise DequantError("CG111", name, f"{absmax.size} absmax values for {blocks} blocks of "
                                          f"{state['blocksize']}")
    _finite(absmax, name)
    return absmax


def _finite(scales: np.ndarray, name: str) -> None:
    import numpy as np

    if not np.isfinite(scales).all():
        bad = int(np.count_nonzero(~np.isfinite(scales)))
        raise DequantError("CG205", name, f"{bad} scale(s) are NaN or infinite")
