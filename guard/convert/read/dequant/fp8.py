"""The FP8 family: fine-grained block FP8, FBGEMM FP8 per row, NVIDIA ModelOpt FP8 and NVFP4.

- ``fp8`` (transformers ``FineGrainedFP8Config``; DeepSeek-V3/R1, Qwen3-FP8): ``P.weight``
  F8_E4M3 ``[out, in]`` and ``P.weight_scale_inv`` F32 ``[ceil(out/bh), ceil(in/bw)]`` with
  ``weight_block_size`` ``[bh, bw]`` (128x128 unless the config says otherwise).  Despite its
  name the "inverse" scale multiplies: ``w = float(weight) * scale_inv`` over each block, the
  edge blocks cut to the weight (DeepSeek's ``weight_dequant``, compressed-tensors' BLOCK strategy).
- ``fbgemm_fp8``: ``P.weight`` F8_E4M3 and ``P.weight_scale`` F32 ``[out, 1]``: one scale a row.
- ``modelopt`` FP8: ``P.weight`` F8_E4M3 and a per-tensor ``P.weight_scale``; NVFP4:
  ``P.weight`` U8 (two E2M1 codes a byte, low nibble first), ``P.weight_scale`` F8_E4M3 per 16
  columns and the per-tensor F32 ``P.weight_scale_2``: ``w = fp4 * weight_scale * weight_scale_2``
  (vLLM's ModelOpt loader; ``input_scale`` is for activations and plays no part).

Every case is ``compressed_tensors.affine`` with no zero point: float32 out, one band of rows
of temporaries at a time, so DeepSeek-V3's largest expert matrices stream in bounded memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read
from guard.convert.read.dequant.compressed_tensors import affine, fp4_values, optional, stored_names

if TYPE_CHECKING:
    import numpy as np

DEFAULT_BLOCK = (128, 128)  # transformers' FineGrainedFP8Config default weight_block_size


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    import numpy as np

    prefix, names = module.prefix, stored_names(module)
    weight = read(f"{prefix}.weight")
    scale_inv = optional(read, f"{prefix}.weight_scale_inv", names)
    if scale_inv is not None:  # fine-grained: blocks
        out = affine(weight, scale_inv.astype(np.float32), None, block=block_size(quant),
                     name=f"{prefix}.weight_scale_inv")
        return {f"{prefix}.weight": out}
    scale_name = f"{prefix}.weight_scale"
    scale = optional(read, scale_name, names)
    if scale is None:
        raise DequantError("CG110", module.payload, f"FP8 weight without {scale_name} or weight_scale_inv")
    if weight.dtype == np.uint8:  # ModelOpt NVFP4
        second = optional(read, f"{prefix}.weight_scale_2", names)
        factor = scale.astype(np.float32)
        if second is not None:
            factor = factor * np.float32(second.astype(np.float32).reshape(-1)[0])
        return {f"{prefix}.weight": affine(weight, factor, None, name=scale_name, decode=fp4_values,
                                           width=weight.shape[-1] * 2)}
    return {f"{prefix}.weight": affine(weight, scale.astype(np.float32), None, name=scale_name)}


def elements(module: Any, quant: Any, read: Any, name: str, flat: list[int]) -> np.ndarray | None:
    """The read-back check's sampled elements of a fine-grained (2-D block) weight, recomputed from the
    source: the sampled FP8 codes read from their bytes, each times its block's ``scale_inv``, the same
    float32 product ``affine`` makes (exact conversion, one rounding).  None (the whole module is
    dequantized again) for every other layout."""
    import numpy as np

    prefix = module.prefix
    if name != f"{prefix}.weight" or not hasattr(read, "elements"):
        return None
    scale_name = f"{prefix}.weight_scale_inv"
    try:
        weight_info, scale_info = read.info(f"{prefix}.weight"), read.info(scale_name)
    except DequantError:
        return None
    if weight_info.dtype == "U8" or len(weight_info.shape) != 2 or len(scale_info.shape) != 2:
        return None
    rows, cols = weight_info.shape
    bh, bw = block_size(quant)
    if scale_info.shape != (-(-rows // bh), -(-cols // bw)) or scale_info.shape[0] == rows:
        return None  # not the block layout affine reads as blocks
    scale = read(scale_name).astype(np.float32)
    index = np.asarray(flat, dtype=np.intp)
    r, c = np.divmod(index, cols)
    codes = read.elements(f"{prefix}.weight", [int(i) for i in flat]).astype(np.float32)
    return codes * scale[r // bh, c // bw]


def block_size(quant: Any) -> tuple[int, int]:
    params = getattr(quant, "params", None) or {}
    block = params.get("weight_block_size")
    if isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(v, int) and v > 0 for v in block):
        return int(block[0]), int(block[1])
    return DEFAULT_BLOCK
