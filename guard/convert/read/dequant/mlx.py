"""MLX (mlx-lm): ``P.weight`` U32 ``[out, in*bits/32]`` with ``P.scales`` (and ``P.biases``) per group.

As ``mlx.core.dequantize``:

- ``affine`` (the default): codes are ``bits`` wide, packed as one little-endian bit stream per
  row of uint32 words (element i at bit i*bits, so 3-, 5- and 6-bit codes straddle words);
  ``w = scales * q + biases`` over each ``group_size`` run of columns (bf16/f16 scales and biases).
- ``mxfp4``: 4-bit E2M1 codes (low nibble first), groups of 32 sharing an E8M0 scale byte,
  ``w = fp4 * 2^(scale - 127)``; no biases.  ``nvfp4``: groups of 16 and F8_E4M3 scales.
  ``mxfp8``: 8-bit E4M3 codes, groups of 32, E8M0 scales.

``bits``/``group_size``/``mode`` come from the config's ``quantization`` record (per-module
entries override it); without one the group size is read from the scales' width.  Embeddings
and ``lm_head`` are quantized like any linear layer, so every module maps ``P.weight`` to ``P.weight``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read, row_bands
from guard.convert.read.dequant.compressed_tensors import (
    fp4_values,
    optional,
    require_finite,
    stored_names,
    unpack_dense,
)
from guard.findings import shown

if TYPE_CHECKING:
    import numpy as np

DEFAULTS = {"affine": (4, 64), "mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}  # mode -> bits, group


def settings(module: Any, quant: Any) -> tuple[str, int | None, int | None]:
    """(mode, bits, group_size) for one module: what the inventory resolved for it (per-module overrides
    included), else its own entry in the config record, else the record's."""
    params = getattr(quant, "params", None) or {}
    nested = params.get("quantization")
    record = nested if isinstance(nested, dict) else params
    own = record.get(module.prefix) if isinstance(record, dict) else None
    chosen = own if isinstance(own, dict) else record
    mode = getattr(module, "format", None) or chosen.get("mode") or getattr(quant, "format", None) or "affine"
    bits = getattr(module, "bits", None) or chosen.get("bits", getattr(quant, "bits", None))
    group = getattr(module, "group_size", None) or chosen.get("group_size", getattr(quant, "group_size", None))
    return str(mode), bits if isinstance(bits, int) else None, group if isinstance(group, int) else None


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    if module.logical_shape:
        return {f"{module.prefix}.weight": tuple(module.logical_shape)}
    mode, bits, _ = settings(module, quant)
    words = read(module.payload)
    bits = bits or DEFAULTS.get(mode, (4, 0))[0]
    return {f"{module.prefix}.weight": (*words.shape[:-1], words.shape[-1] * 32 // bits)}


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    import numpy as np

    prefix, names = module.prefix, stored_names(module)
    mode, bits, group = settings(module, quant)
    words = read(f"{prefix}.weight")
    scales = read(f"{prefix}.scales")
    biases = optional(read, f"{prefix}.biases", names) if mode == "affine" else None
    if mode == "affine" and biases is None:
        raise DequantError("CG110", f"{prefix}.biases", "MLX affine weight without its biases")
    if mode not in DEFAULTS:
        raise DequantError("CG112", module.payload, f"MLX quantization mode {mode!r} is not one this tool reads")
    bits = bits or DEFAULTS[mode][0]
    if mode in ("mxfp4", "mxfp8") and np.count_nonzero(scales.view(np.uint8) == 0xFF):
        raise DequantError("CG205", f"{prefix}.scales",
                           f"E8M0 scale bytes of 0xFF (NaN) in {shown(prefix + '.scales')}")
    if mode not in ("mxfp4", "mxfp8"):
        require_finite(scales, f"{prefix}.scales")
    if biases is not None:
        require_finite(biases, f"{prefix}.biases")
    columns = words.shape[-1] * 32 // bits
    group = group or (columns // scales.shape[-1] if scales.shape[-1] else 0)
    if not group or scales.shape[-1] * group != columns or scales.shape[:-1] != words.shape[:-1]:
        raise DequantError("CG111", f"{prefix}.scales", f"scales {list(scales.shape)} do not cover "
                           f"{list(words.shape[:-1])} x {columns} in groups of {group}")
    return {f"{prefix}.weight": mlx_dequantize(words, scales, biases, group, bits, mode)}


def mlx_dequantize(words: np.ndarray, scales: np.ndarray, biases: np.ndarray | None,
                   group: int, bits: int, mode: str = "affine") -> np.ndarray:
    import ml_dtypes
    import numpy as np

    lead = words.shape[:-1]
    rows = words.reshape(-1, words.shape[-1]).view(np.uint32)
    columns = rows.shape[-1] * 32 // bits
    scale_rows = scales.reshape(rows.shape[0], -1)
    bias_rows = None if biases is None else biases.reshape(rows.shape[0], -1).astype(np.float32)
    out = np.empty((rows.shape[0], columns), dtype=np.float32)
    for band in row_bands(rows.shape[0], columns):
        n = band.stop - band.start
        if mode in ("mxfp4", "nvfp4"):
            values = fp4_values(rows[band].view(np.uint8))
        elif mode == "mxfp8":
            values = rows[band].view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        else:
            values = unpack_dense(rows[band], bits, columns).astype(np.float32)
        values = values.reshape(n, -1, group)
        if mode in ("mxfp4", "mxfp8"):
            np.ldexp(values, scale_rows[band].view(np.uint8).astype(np.int32)[..., None] - 127, out=values)
        else:
            values *= scale_rows[band].astype(np.float32)[..., None]
        if bias_rows is not None:
            values += bias_rows[band][..., None]
        out[band] = values.reshape(n, columns)
    return out.reshape(*lead, columns)
