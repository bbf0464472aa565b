"""Explicit dtype casts: which tensors change, and a refusal (CG201) when a cast makes infinities.

``--dtype keep`` casts nothing.  ``--keep-fp32`` globs hold floating tensors in fp32
whatever the target.  Integer and bool tensors never change.  Rounding is numpy /
ml_dtypes round-to-nearest-even, bit-identical to torch's (reference section 7); an fp64
source narrows to 16 bits through fp32, as torch's does.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from guard import dtypes
from guard.catalogue import make_finding
from guard.findings import Finding
from guard.records import Record
from guard.write.bitviews import numpy_dtype

if TYPE_CHECKING:
    import numpy as np

DTYPE_CHOICES = {"keep": None, "fp32": "F32", "bf16": "BF16", "fp16": "F16"}


class CastPolicy(Record):
    target: str | None  # a safetensors code; None keeps every dtype
    keep_fp32: tuple[str, ...] = ()

    def dtype_for(self, code: str, *names: str) -> str:
        """The output dtype of a tensor stored as ``code`` under any of ``names``."""
        if not dtypes.is_float(code):
            return code
        if any(fnmatchcase(name, pattern) for name in names for pattern in self.keep_fp32):
            return "F32"
        return self.target or code


class CastCheck:
    """Casts a tensor piece by piece (bands of a stream) and counts what overflowed, for one CG201."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.target = numpy_dtype(code)
        self.count = 0
        self.worst = 0.0

    def cast(self, piece: np.ndarray) -> np.ndarray:
        import numpy as np

        if piece.dtype == self.target:
            return piece
        with np.errstate(over="ignore", invalid="ignore"):
            if piece.dtype.itemsize == 8 and self.target.itemsize < 4:
                # torch narrows a double through float (c10::Half and c10::BFloat16 are built from a
                # float), so its fp64 -> fp16/bf16 rounds twice; numpy and ml_dtypes >= 0.7 round once
                out = piece.astype(np.float32).astype(self.target)
            else:
                out = piece.astype(self.target)
        if out.dtype.itemsize > piece.dtype.itemsize:
            return out  # widening (fp16/bf16 -> fp32, fp32 -> fp64) is exact
        created = np.isinf(out) & np.isfinite(piece)
        count = int(np.count_nonzero(created))
        if count:
            self.count += count
            self.worst = max(self.worst, float(np.max(np.abs(piece[created].astype(np.float64)))))
        return out

    def finding(self, *, name: str, path: str) -> Finding | None:
        if not self.count:
            return None
        return make_finding(
            "CG201", path,
            f"{self.count} value(s) overflow {dtypes.display_name(self.code)} and become inf "
            f"(max |x| = {self.worst:.6g})", tensor=name)

