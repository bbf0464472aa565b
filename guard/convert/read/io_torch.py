"""PyTorch-side sources: safetensors read by byte ranges; .bin via torch.load.

safetensors needs no framework at all: a tensor is a byte range, read with
``readinto`` into a fresh numpy buffer.  ``.bin`` files go through torch's
weights-only unpickler (memory-mapped for the zip format), one shard at a time.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guard.errors import MalformedCheckpoint
from guard.tensors import TensorInfo
from guard.write.bitviews import dtype_code, numpy_dtype, torch_to_numpy
from guard.write.produce import read_into

if TYPE_CHECKING:
    import numpy as np

_ZIP_MAGIC = b"PK\x03\x04"


class UnsafePickle(MalformedCheckpoint):
    """torch's weights-only unpickler refused the file (CG003)."""


def read_range(info: TensorInfo) -> np.ndarray:
    """The tensor's bytes from its file into a fresh, writable array of its dtype and shape."""
    import numpy as np

    assert info.data_start is not None and info.data_end is not None
    size = info.data_end - info.data_start
    buf = np.empty(size, np.uint8)
    view = buf.data  # memoryview(buf), typed (numpy types __buffer__ from 3.12)
    with open(info.file, "rb", buffering=0) as fh:
        fh.seek(info.data_start)
        if read_into(fh, view) < size:
            raise MalformedCheckpoint(f"{info.file}: {info.name} is truncated")
    return buf.view(numpy_dtype(info.dtype)).reshape(info.shape)


class OneFileCache:
    """Keeps the most recently loaded file: bounds memory to one shard."""

    def __init__(self, load: Callable[[Path], Any]) -> None:
        self._load = load
        self._path: Path | None = None
        self._value: Any = None

    def get(self, path: Path) -> Any:
        if path != self._path:
            self._value = None  # drop the old shard before loading the next
            self._value = self._load(path)
            self._path = path
        return self._value


def torch_load(path: Path) -> dict[str, Any]:
    """A state dict through torch's weights-only unpickler; memory-mapped for zip files."""
    import torch

    with open(path, "rb") as fh:
        is_zip = fh.read(4) == _ZIP_MAGIC
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as exc:
        raise UnsafePickle(f"torch's weights-only loader refused it: {str(exc).splitlines()[0][:200]}") from None
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise MalformedCheckpoint(str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__) from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise MalformedCheckpoint(f"holds a {type(obj).__name__}, not a state dict")
    return obj


def torch_bin_tensors(path: Path) -> list[TensorInfo]:
    import torch

    state = torch_load(path)
    out = []
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise MalformedCheckpoint(f"entry {name!r} is a {type(value).__name__}, not a tensor")
        out.append(TensorInfo(str(name), dtype_code(value.dtype), tuple(value.shape), str(path)))
    return out


class TorchBinLoader:
    def __init__(self) -> None:
        self._cache = OneFileCache(torch_load)

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        tensor = self._cache.get(Path(info.file))[info.name]
        return np.ascontiguousarray(torch_to_numpy(tensor))


class RangeLoader:
    def load(self, info: TensorInfo) -> np.ndarray:
        return read_range(info)


