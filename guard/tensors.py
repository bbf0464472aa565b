"""What a reader learns about a checkpoint file from its headers.

Records are tuple subclasses (``guard.records``), not dataclasses: they are built on every scan's
path, and a pre-commit hook pays for the dataclasses machinery on every commit.  A safetensors file
keeps its tensors in columns instead (``TensorColumns``: no record per tensor until a caller walks
them); the rules read fields a column at a time (``column``, ``select``), whichever a file holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import accumulate, chain, compress, islice, repeat
from math import prod
from operator import add, itemgetter
from types import MappingProxyType

from guard import dtypes
from guard.findings import Finding
from guard.records import Record


class TensorInfo(Record):
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
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (the hook's path)
if TYPE_CHECKING:  # to the type checker a getter is a function of a TensorInfo, and a column holds its values
    from collections.abc import Callable
    from typing import Any, Protocol, TypeVar

    _V = TypeVar("_V")

    class TrainingClaim(Protocol):
        """A scan's ``training``: guard.training.state.TrainingState, by the fields read below the training
        layer (guard.training imports this module)."""

        @property
        def layout(self) -> str: ...
        @property
        def publishes(self) -> str: ...
        @property
        def homes(self) -> tuple[object, ...]: ...

    TENSOR_NAME: Callable[[TensorInfo], str]
    TENSOR_DTYPE: Callable[[TensorInfo], str]
    TENSOR_SHAPE: Callable[[TensorInfo], tuple[int, ...]]
    TENSOR_FILE: Callable[[TensorInfo], str]
    TENSOR_STORAGE: Callable[[TensorInfo], str | None]
else:
    TENSOR_NAME, TENSOR_DTYPE, TENSOR_SHAPE, TENSOR_FILE, TENSOR_STORAGE = (
        itemgetter(TensorInfo._fields.index(field)) for field in ("name", "dtype", "shape", "file", "storage"))



class _AsTuple(Sequence[TensorInfo]):
    """What a tuple of records does beyond a sequence: equal to the tuple of the same records, hashed, added
    and shown as it."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, _AsTuple)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Sequence[TensorInfo]) -> tuple[TensorInfo, ...]:
        return tuple(self) + tuple(other)

    def __radd__(self, other: Sequence[TensorInfo]) -> tuple[TensorInfo, ...]:
        return tuple(other) + tuple(self)

    def __repr__(self) -> str:
        return repr(tuple(self))


class TensorColumns(_AsTuple):
    """One file's tensors kept in columns: what a safetensors header in its usual form gives.

    A sharded model's scan holds 200,000 tensors; a record each (a nine-field tuple and its end offset,
    ~130 bytes) was most of its memory.  Here a file keeps its names as one list, each tensor's
    ``(code, shape, bytes)`` span as one list of tuples its header shares with every other header of
    that dtype and shape, and where its data buffer starts: the tensors tile the buffer in order, so
    each one's offsets are the sums of the sizes before it, worked out when a record is made.  The rules
    read the columns (``column``, ``select``); a caller that iterates or indexes gets the very records
    the reader would have made, built once per file on first use and kept, so two walks of a file meet
    the same objects (``is`` holds between them).
    """

    __slots__ = ("names", "spans", "file", "base", "begins", "_records")

    def __init__(self, names: list[str], spans: list[tuple[str, tuple[int, ...], int]], file: str,
                 base: int, begins: list[int] | None = None) -> None:
        self.names = names  # never changed after this: callers get the list itself
        self.spans = spans
        self.file = file
        self.base = base  # where the data buffer starts in the file
        # each tensor's start relative to ``base``, where the header lists them out of the buffer's order
        # (a ``sort_keys`` header); None: they tile it in header order, each starting where the last ended
        self.begins = begins
        self._records: tuple[TensorInfo, ...] | None = None

    def _starts_stops(self) -> tuple[list[int], list[int]]:
        """Each tensor's start and end offsets in the file."""
        base = self.base
        if self.begins is not None:
            starts = list(map(base.__add__, self.begins))
            return starts, list(map(add, starts, map(_SPAN_BYTES, self.spans)))
        stops = list(accumulate(map(_SPAN_BYTES, self.spans), initial=base))
        return stops[:-1], stops[1:]

    def records(self) -> tuple[TensorInfo, ...]:
        made = self._records
        if made is None:
            starts, stops = self._starts_stops()
            made = self._records = tuple(
                TensorInfo(name, code, shape, self.file, start, stop)
                for name, (code, shape, _), start, stop in zip(self.names, self.spans, starts, stops))
        return made

    def column(self, getter: Callable[[TensorInfo], Any]) -> Iterable[Any]:
        if getter is TENSOR_NAME:
            return self.names
        if getter is TENSOR_DTYPE:
            return map(_SPAN_CODE, self.spans)
        if getter is TENSOR_SHAPE:
            return map(_SPAN_SHAPE, self.spans)
        if getter is TENSOR_FILE:
            return repeat(self.file, len(self.names))
        if getter is TENSOR_STORAGE:
            return repeat(None, len(self.names))
        return map(getter, self.records())

    def picked(self, indices: Iterable[int]) -> list[TensorInfo]:
        """The records at ``indices``: the file's own where they were made, else fresh ones for these alone."""
        if self._records is not None:
            return list(map(self._records.__getitem__, indices))
        names, spans, file = self.names, self.spans, self.file
        starts, stops = self._starts_stops()
        return [TensorInfo(names[i], spans[i][0], spans[i][1], file, starts[i], stops[i]) for i in indices]

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self._records or self.records())

    def __getitem__(self, index):  # an int or a slice, as a tuple's
        return (self._records or self.records())[index]

    def __contains__(self, value: object) -> bool:
        return value in (self._records or self.records())

    def __reduce__(self) -> tuple[object, ...]:
        return TensorColumns, (self.names, self.spans, self.file, self.base, self.begins)


class TensorChain(_AsTuple):
    """Several files' tensors as one sequence (a set's tensors of one dtype), columns kept where a part has
    them: ``by_dtype`` of a sharded set is 4,000 files' columns, not 200,000 records."""

    __slots__ = ("parts", "_starts")

    def __init__(self, parts: tuple[Sequence[TensorInfo], ...]) -> None:
        self.parts = parts
        self._starts = list(accumulate(map(len, parts), initial=0))

    def column(self, getter: Callable[[TensorInfo], Any]) -> Iterable[Any]:
        return chain.from_iterable(column(getter, part) for part in self.parts)

    def __len__(self) -> int:
        return self._starts[-1]

    def __iter__(self) -> Iterator[TensorInfo]:
        return chain.from_iterable(self.parts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("tuple index out of range")
        from bisect import bisect_right  # indexing a chain is rare: the scan's path never imports bisect

        part = bisect_right(self._starts, index) - 1
        return self.parts[part][index - self._starts[part]]

    def __reduce__(self) -> tuple[object, ...]:
        return TensorChain, (self.parts,)


_COLUMNAR = (TensorColumns, TensorChain)
_SPAN_CODE, _SPAN_SHAPE, _SPAN_BYTES = itemgetter(0), itemgetter(1), itemgetter(2)


def column(getter: Callable[[TensorInfo], _V], tensors: Iterable[TensorInfo]) -> Iterable[_V]:
    """One field of every tensor (``TENSOR_NAME``, ...), in order: a columnar file's own column, else the
    field of each record, in C either way."""
    if type(tensors) in _COLUMNAR:
        return tensors.column(getter)  # type: ignore[attr-defined]  # a columnar type: checked above
    return map(getter, tensors)


def select(tensors: Sequence[TensorInfo], flags: Iterable[object]) -> list[TensorInfo]:
    """The tensors whose flag is true (``compress``); a columnar sequence makes records only for those.

    A file whose records were not made yet gives fresh ones (``is`` does not hold between them and a
    later walk's, ``==`` does)."""
    kind = type(tensors)
    if kind is TensorChain:
        flags = iter(flags)
        picked: list[TensorInfo] = []
        for part in tensors.parts:  # type: ignore[attr-defined]  # tensors is a TensorChain: its type checked above
            picked += select(part, islice(flags, len(part)))
        return picked
    if kind is TensorColumns:
        return tensors.picked(compress(range(len(tensors)), flags))  # type: ignore[attr-defined]  # tensors is a TensorColumns here: the other kind with picked()
    return list(compress(tensors, flags))


def joined(parts: list[Sequence[TensorInfo]]) -> Sequence[TensorInfo]:
    """Parts as one sequence: a tuple of their records, or a chain where a part keeps columns."""
    if any(type(part) in _COLUMNAR for part in parts):
        return TensorChain(tuple(parts)) if len(parts) != 1 else parts[0]
    return tuple(chain.from_iterable(parts))


# Formats a reader may report.
FORMATS = ("safetensors", "torch-zip", "torch-legacy", "torchscript", "torch-export", "flax-msgpack", "lfs-pointer",
           "gguf", "onnx", "npy", "npz", "hdf5", "keras", "orbax", "openvino", "coreml", "tf-bundle", "tflite",
           "executorch", "dcp", "deepspeed")  # training checkpoints (guard.training) add theirs


NO_METADATA: Mapping[str, str] = MappingProxyType({})


class FileScan(Record):
    """A reader's result for one file: tensors plus findings in the file itself."""

    path: str
    format: str | None  # one of FORMATS; None when unreadable
    size: int
    tensors: Sequence[TensorInfo] = ()  # a tuple of records, or a file's columns (TensorColumns)
    findings: tuple[Finding, ...] = ()
    metadata: Mapping[str, str] = NO_METADATA
    bytes_read: int = 0
    # Other files this one needs, relative to its directory (ONNX external data, ...);
    # the inventory resolves them against the directory listing, local or remote.
    companions: tuple[str, ...] = ()
    # A training checkpoint read as one scan (guard.training.state.TrainingState); None for any other file.
    training: TrainingClaim | None = None
