"""Dequantizers: one module per quantization family, looked up by the method
``guard.inventory.quantization.Quantization`` names.

Each row is ``method -> "module:function"``; the module is imported only when a model of that
method is converted.  A dequantizer is numpy (+ ml_dtypes) only and returns float32 arrays in
the module's logical shape; the pipeline (``guard.convert.dequantized``) rounds once to the
output dtype and streams each result to the writer, so one module's arrays are alive at a time.

    dequantize(module: QuantModule, quant: Quantization, read: Read) -> {output name: float32 array}
    outputs(module, quant, read) -> {output name: logical shape}   # optional; planned before any payload is read

``read(name)`` returns a stored tensor as numpy in its stored dtype (ml_dtypes for BF16/F8), one
at a time; a name the set does not hold raises ``DequantError("CG110", ...)``.  ``read.info(name)`` is
its header record (``TensorInfo``: dtype, shape) with nothing read; ``read.config`` is config.json
(a dict, or None).  Without ``outputs``
the plan is ``{module.weight: module.logical_shape}``.  A dequantizer that finds the
data inconsistent raises ``DequantError(code, tensor, message)``: the conversion is refused with
that finding and nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from guard.lazy import resolve

if TYPE_CHECKING:
    from typing import Protocol

    import numpy as np

    from guard.tensors import TensorInfo

    class Read(Protocol):
        """What a dequantizer is handed (guard.convert.read.dequant.source's reader), as the docstring says."""

        config: dict[str, Any] | None

        def __call__(self, name: str) -> np.ndarray: ...
        def info(self, name: str) -> TensorInfo: ...
        def elements(self, name: str, flat: list[int]) -> np.ndarray: ...
else:
    Read = Callable[[str], "np.ndarray"]

DEQUANTIZERS: dict[str, str] = {
    "bitsandbytes": "guard.convert.read.dequant.bnb:dequantize",
    "gptq": "guard.convert.read.dequant.gptq:dequantize",
    "awq": "guard.convert.read.dequant.awq:dequantize",
    "hqq": "guard.convert.read.dequant.hqq:dequantize",
    "quanto": "guard.convert.read.dequant.quanto:dequantize",
    "eetq": "guard.convert.read.dequant.eetq:dequantize",
    "bitnet": "guard.convert.read.dequant.bitnet:dequantize",
    "compressed-tensors": "guard.convert.read.dequant.compressed_tensors:dequantize",
    "fp8": "guard.convert.read.dequant.fp8:dequantize",
    "fbgemm_fp8": "guard.convert.read.dequant.fp8:dequantize",
    "modelopt": "guard.convert.read.dequant.fp8:dequantize",
    "mxfp4": "guard.convert.read.dequant.mxfp4:dequantize",
    "mlx": "guard.convert.read.dequant.mlx:dequantize",
    "torchao": "guard.convert.read.dequant.torchao:dequantize",
}

# Rows of the largest intermediate a dequantizer holds at once (codes, zeros, scales expanded):
# 16 MiB of float32 per band keeps the peak at the output array plus a few bands.
BAND_ELEMENTS = 4 * 2**20


class DequantError(Exception):
    """The data cannot be dequantized as declared: a finding ``code`` about ``tensor``."""

    def __init__(self, code: str, tensor: str, message: str) -> None:
        super().__init__(message)
        self.code, self.tensor, self.message = code, tensor, message


def dequantizer(method: str) -> Any:
    """The module holding ``dequantize`` (and maybe ``outputs``) for ``method``; None if there is none."""
    row = DEQUANTIZERS.get(method)
    if row is None:
        return None
    return resolve(row.partition(":")[0])  # the module: its dequantize, and its outputs where it has them


def is_floating(array: np.ndarray) -> bool:
    """Floating, ml_dtypes' bfloat16 and float8 included (numpy files those under kind "V")."""
    return array.dtype.kind == "f" or array.dtype.name.startswith(("bfloat16", "float8", "float4", "float6"))


def row_bands(rows: int, row_elements: int) -> Iterator[slice]:
    """Slices of ``rows`` so that one band holds about BAND_ELEMENTS elements (at least one row)."""
    step = max(1, BAND_ELEMENTS // max(1, row_elements))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))
