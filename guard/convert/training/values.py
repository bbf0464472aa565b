"""``diff --values`` for training checkpoints: a logical tensor has no one byte range (its chunks are spread over
ranks), so it is assembled by its checkpoint's conversion source, one tensor at a time, and compared whole.

``compare_assembled`` answers for a pair where either side is a tensor of a training checkpoint (its ``file`` is
the checkpoint's folder); the other side may be one too, or a plain file's placed tensor.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guard.tensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np

_SOURCES: dict[str, dict[str, Any]] = {}  # checkpoint folder -> model key -> its SourceTensor (opened once per run)


def is_assembled(info: TensorInfo) -> bool:
    return info.data_start is None and os.path.isdir(info.file)


def compare_assembled(old: TensorInfo, new: TensorInfo) -> tuple[bool | None, float | None, float | None, str | None]:
    """(identical, max |new - old|, that over max |old|, why not compared)."""
    if old.shape != new.shape:
        return None, None, None, "shapes differ"
    a, why = _array(old)
    b, why_b = _array(new)
    if a is None or b is None:
        return None, None, None, why or why_b
    if old.dtype == new.dtype and a.tobytes() == b.tobytes():
        return True, 0.0, 0.0, None
    return (False, *_figures(a, b), None)


def _array(info: TensorInfo) -> tuple[np.ndarray | None, str | None]:
    import numpy as np

    from guard.write.bitviews import numpy_dtype

    if not is_assembled(info):
        if info.data_start is None or info.data_end is None or info.stride is not None:
            return None, "the reader did not place this tensor's bytes"
        with open(info.file, "rb") as fh:
            fh.seek(info.data_start)
            data = fh.read(info.data_end - info.data_start)
        return np.frombuffer(data, numpy_dtype(info.dtype)).reshape(info.shape), None
    tensors = _SOURCES.get(info.file)
    if tensors is None:
        from guard.convert.read.source_training import find_training_source

        found = find_training_source(Path(info.file))
        source = found.open() if found is not None else None
        tensors = _SOURCES[info.file] = {} if source is None or source.findings else {
            t.name: t for t in source.tensors}
    tensor = tensors.get(info.name)
    if tensor is None:
        return None, "its training checkpoint could not be assembled (see `ckpt-guard convert`)"
    return tensor.load(), None


def _figures(a: np.ndarray, b: np.ndarray) -> tuple[float | None, float | None]:
    import numpy as np

    wide = np.float64
    old, new = a.astype(wide), b.astype(wide)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(new - old)
    max_abs = float(np.fmax.reduce(diff.reshape(-1))) if diff.size else 0.0
    scale = float(np.fmax.reduce(np.abs(old).reshape(-1))) if old.size else 0.0
    return max_abs, (max_abs / scale if scale else (None if max_abs else 0.0))
