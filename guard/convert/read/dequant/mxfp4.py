"""MXFP4 (gpt-oss): ``*_blocks`` U8 ``[E, rows, G, 16]`` and ``*_scales`` U8 ``[E, rows, G]``.

As transformers' ``integrations/mxfp4.py`` ``convert_moe_packed_tensors`` (the path
``Mxfp4Config(dequantize=True)`` loads): each byte holds two FP4 E2M1 codes, low nibble
first; each group of 32 values along a row shares one E8M0 scale, ``value * 2^(scale - 127)``;
the rows of 32*G values are then transposed, so ``experts.gate_up_proj_blocks``
``[E, 2*I, H/32, 16]`` becomes ``experts.gate_up_proj`` ``[E, H, 2*I]``, the layout of the
unquantized ``GptOssExperts`` parameters.  The output is named by dropping ``_blocks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read
from guard.convert.read.dequant.compressed_tensors import fp4_values
from guard.findings import shown

if TYPE_CHECKING:
    import numpy as np

SCALE_BIAS = 127  # E8M0: 2^(byte - 127); 0xFF is NaN (guard.values.quantized flags it)


def _names(module: Any) -> tuple[str, str]:
    payload = module.payload
    if not payload.endswith("_blocks"):
        raise DequantError("CG110", payload, "MXFP4 payload is not named *_blocks")
    base = payload[: -len("_blocks")]
    return base, f"{base}_scales"


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    base, _ = _names(module)
    if module.logical_shape:
        return {base: tuple(module.logical_shape)}
    blocks = read(module.payload)  # only when the inventory had no logical shape
    *lead, rows, groups, width = blocks.shape
    return {base: (*lead, groups * width * 2, rows)}


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    base, scales_name = _names(module)
    blocks, scales = read(module.payload), read(scales_name)
    return {base: mxfp4_dequantize(blocks, scales, name=scales_name)}


def mxfp4_dequantize(blocks: np.ndarray, scales: np.ndarray, *, name: str = "scales") -> np.ndarray:
    """float32 ``[*lead, G*32, rows]`` from blocks ``[*lead, rows, G, 16]``, one leading slice at a time."""
    import numpy as np

    if blocks.ndim < 3 or blocks.shape[:-1] != scales.shape:
        raise DequantError("CG111", name, f"MXFP4 blocks {list(blocks.shape)} and scales "
                           f"{list(scales.shape)} disagree")
    *lead, rows, groups, width = blocks.shape
    nan = int(np.count_nonzero(scales.view(np.uint8) == 0xFF))
    if nan:
        raise DequantError("CG205", name, f"{nan:,} E8M0 scale byte(s) of {shown(name)} are 0xFF (NaN)")
    exponents = scales.view(np.uint8).astype(np.int32) - SCALE_BIAS
    flat_blocks = blocks.reshape(-1, rows, groups, width)
    flat_exps = exponents.reshape(-1, rows, groups)
    out = np.empty((flat_blocks.shape[0], groups * width * 2, rows), dtype=np.float32)
    for index in range(flat_blocks.shape[0]):
        values = fp4_values(flat_blocks[index])  # [rows, G, 32]
        np.ldexp(values, flat_exps[index][..., None], out=values)
        out[index] = values.reshape(rows, groups * width * 2).T
    return out.reshape(*lead, groups * width * 2, rows)
