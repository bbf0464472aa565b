"""What a reader learns about a checkpoint file from its headers.

Records are NamedTuples, not dataclasses: they are built on every scan's path, and a
pre-commit hook pays for the dataclasses machinery on every commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from operator import itemgetter
from types import MappingProxyType

from guard import dtypes
from guard.findings import Finding
from guard.records import record


@record
class TensorInfo:
    """One tensor, from headers only.

    ``data_start``/``data_end`` are absolute byte offsets of the tensor's bytes in
    its file (None where the format does not place them: e.g. a chunked flax
    array).  ``stride`` is in elements and None for C-contiguous data;
    ``storage`` names a shared torch storage (views and tied weights share one).
    """

    name: str
    dtype: str  # a safetensors code, or the raw string for an unknown dtype (CG005)
    shape: tuple[int, ...]
    file: str
    data_start: int | None = None
    data_end: int | None = None
    stride: tuple[int, ...] | None = None
    storage: str | None = None
    storage_offset: int | None = None  # bytes into ``storage``: two names on one span are one tensor (tied)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int | None:
        return dtypes.nbytes(self.dtype, self.numel)



# TensorInfo's fields as getters that run in C: ``map(TENSOR_NAME, tensors)`` makes no Python call per tensor
# (records are tuples), which the rules over a 200,000-tensor sharded set rely on.
TENSOR_NAME, TENSOR_DTYPE, TENSOR_SHAPE, TENSOR_FILE, TENSOR_STORAGE = (
    itemgetter(TensorInfo._fields.index(field)) for field in ("name", "dtype", "shape", "file", "storage"))

# Formats a reader may report.
FORMATS = ("safetensors", "torch-zip", "torch-legacy", "torchscript", "torch-export", "flax-msgpack", "lfs-pointer", "gguf", "onnx", "npy",
           "npz", "hdf5", "keras", "orbax", "openvino", "coreml", "tf-bundle", "tflite", "executorch",
           "dcp", "deepspeed")  # training checkpoints (guard.training) add theirs


NO_METADATA: Mapping[str, str] = MappingProxyType({})


@record
class FileScan:
    """A reader's result for one file: tensors plus findings in the file itself."""

    path: str
    format: str | None  # one of FORMATS; None when unreadable
    size: int
    tensors: tuple[TensorInfo, ...] = ()
    findings: tuple[Finding, ...] = ()
    metadata: Mapping[str, str] = NO_METADATA
    bytes_read: int = 0
    # Other files this one needs, relative to its directory (ONNX external data, ...);
    # the inventory resolves them against the directory listing, local or remote.
    companions: tuple[str, ...] = ()
    # A training checkpoint read as one scan (guard.training.state.TrainingState); None for any other file.
    training: object | None = None  # typed loosely: guard.training imports this module
