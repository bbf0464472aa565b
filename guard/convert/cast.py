"""Explicit dtype casts: which tensors change, and a refusal (CG201) when a cast makes infinities.

``--dtype keep`` casts nothing.  ``--keep-fp32`` globs hold floating tensors in fp32
whatever the target.  Integer and bool tensors never change.  Rounding is numpy /
ml_dtypes round-to-nearest-even, bit-identical to torch's (reference section 7).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from guard import dtypes
from guard.catalogue import make_finding
from guard.convert.bitviews import numpy_dtype
from guard.findings import Finding

if TYPE_CHECKING:
    import numpy as np

DTYPE_CHOICES = {"keep": None, "fp32": "F32", "bf16": "BF16", "fp16": "F16"}


@dataclass(frozen=True)
class CastPolicy:
    target: str | None  # a safetensors code; None keeps every dtype
    keep_fp32: tuple[str, ...] = ()

    def dtype_for(self, code: str, *names: str) -> str:
        """The output dtype of a tensor stored as ``code`` under any of ``names``."""
        if not dtypes.is_float(code):
            return code
        if any(fnmatchcase(name, pattern) for name in names for pattern in self.keep_fp32):
            return "F32"
        return self.target or code


def cast_array(array: np.ndarray, code: str, *, name: str, path: str) -> tuple[np.ndarray, Finding | None]:
    """``array`` in dtype ``code``; a CG201 finding when the cast turned finite values into inf."""
    import numpy as np

    target = numpy_dtype(code)
    if array.dtype == target:
        return array, None
    with np.errstate(over="ignore", invalid="ignore"):
        out = array.astype(target)
    if out.dtype.itemsize > array.dtype.itemsize:
        return out, None  # widening (fp16/bf16 -> fp32, fp32 -> fp64) is exact
    created = np.isinf(out) & np.isfinite(array)
    count = int(np.count_nonzero(created))
    if not count:
        return out, None
    worst = float(np.max(np.abs(array[created].astype(np.float64))))
    finding = make_finding(
        "CG201", path,
        f"{count} value(s) overflow {dtypes.display_name(code)} and become inf (max |x| = {worst:.6g})",
        tensor=name)
    return out, finding
