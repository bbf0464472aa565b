"""Flax msgpack checkpoints, header-only: walk the msgpack tokens, seek past array payloads.

``flax.serialization`` writes a tree of maps whose array leaves are
``ExtType(1, packb([shape, dtype.name, C-order bytes]))`` (code 3: a numpy scalar,
code 2: a Python complex); leaves over 2**30 bytes become a chunked-array map.
There is no index, so we read every token but never a payload: the cursor reads through
the readers' ``Window`` (64 KiB blocks that grow while the tokens run on, a jump past a
large payload), so a skipped payload costs nothing, local or over HTTP ranges.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from typing import TypeVar

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding
from guard.readers.binary.window import Window
from guard.records import Record
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

MAX_DEPTH = 512  # flax trees are a few levels deep; the cap bounds hostile nesting
MAX_KEY_BYTES = 64 * 1024
MAX_ENTRIES = 250_000  # map/array entries per file: far beyond any model (~1 s to walk)
MAX_RANK = 64  # numpy's limit
CHUNKED_MARKER = "__msgpack_chunked_array__"
EXT_NDARRAY, EXT_COMPLEX, EXT_NPSCALAR = 1, 2, 3
T = TypeVar("T")

# numpy dtype names with no safetensors code, for the payload size check (CG005 all the same).
EXTRA_ITEMSIZES = {"complex128": 16, "complex256": 32, "float128": 16, "float8_e4m3": 1,
                   "float8_e3m4": 1, "float8_e4m3b11fnuz": 1, "int4": 1, "uint4": 1,
                   "int2": 1, "uint2": 1}

# marker byte -> (kind, width of its length or value field)
_SIZED = {0xc4: ("bin", 1), 0xc5: ("bin", 2), 0xc6: ("bin", 4),
          0xc7: ("ext", 1), 0xc8: ("ext", 2), 0xc9: ("ext", 4),
          0xd9: ("str", 1), 0xda: ("str", 2), 0xdb: ("str", 4),
          0xdc: ("array", 2), 0xdd: ("array", 4), 0xde: ("map", 2), 0xdf: ("map", 4)}
_FIXEXT = {0xd4: 1, 0xd5: 2, 0xd6: 4, 0xd7: 8, 0xd8: 16}
_NUMBERS = {0xca: ("float", 4, False), 0xcb: ("float", 8, False),
            0xcc: ("int", 1, False), 0xcd: ("int", 2, False), 0xce: ("int", 4, False),
            0xcf: ("int", 8, False), 0xd0: ("int", 1, True), 0xd1: ("int", 2, True),
            0xd2: ("int", 4, True), 0xd3: ("int", 8, True)}
_CONSTANTS = {0xc0: ("nil", 0, 0), 0xc2: ("bool", 0, 0), 0xc3: ("bool", 1, 0)}


class _Head(Record):
    kind: str  # map | array | str | bin | ext | int | float | bool | nil
    value: int  # entry count, byte length, or the int / bool itself
    ext_type: int  # 0 but on an ext (given every time: the record's quickest construction, once per token)


class _Cursor:
    """Sequential reads through the readers' one buffered ``Window``; ``skip`` seeks without reading."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.win = Window(source)
        self.pos = 0

    @property
    def bytes_read(self) -> int:
        return self.win.bytes_read

    @property
    def remaining(self) -> int:
        return self.source.size - self.pos

    def take(self, n: int) -> bytes:
        self._need(n)
        at = self.win.need(self.pos, n, "msgpack data")
        self.pos += n
        return self.win.data[at:at + n]

    def skip(self, n: int) -> None:
        self._need(n)
        self.pos += n

    def uint(self, width: int, *, signed: bool = False) -> int:
        return int.from_bytes(self.take(width), "big", signed=signed)

    def _need(self, n: int) -> None:
        if n > self.remaining:
            raise MalformedCheckpoint(
                f"{n:,} bytes needed at offset {self.pos:,} but only {self.remaining:,} remain: truncated?"
            )


def _read_head(cur: _Cursor) -> _Head:
    """One msgpack token's header; lengths are checked against the bytes left."""
    at = cur.pos
    marker = cur.take(1)[0]
    if marker <= 0x7f or marker >= 0xe0:
        return _Head("int", marker if marker <= 0x7f else marker - 0x100, 0)
    if marker <= 0x8f:
        head = _Head("map", marker & 0x0f, 0)
    elif marker <= 0x9f:
        head = _Head("array", marker & 0x0f, 0)
    elif marker <= 0xbf:
        head = _Head("str", marker & 0x1f, 0)
    elif marker in _SIZED:
        kind, width = _SIZED[marker]
        length = cur.uint(width)
        head = _Head(kind, length, cur.uint(1, signed=True) if kind == "ext" else 0)
    elif marker in _FIXEXT:
        head = _Head("ext", _FIXEXT[marker], cur.uint(1, signed=True))
    elif marker in _NUMBERS:
        kind, width, signed = _NUMBERS[marker]
        if kind == "float":
            cur.skip(width)
            return _Head("float", 0, 0)
        return _Head("int", cur.uint(width, signed=signed), 0)
    elif marker in _CONSTANTS:
        return _Head(*_CONSTANTS[marker])
    else:
        raise MalformedCheckpoint(f"byte 0x{marker:02x} at offset {at:,} is not a msgpack type")
    # Every entry takes at least one byte (two for a key and its value): a length
    # that cannot fit in the rest of the file is rejected before anything is sized by it.
    needed = head.value * (2 if head.kind == "map" else 1)
    if needed > cur.remaining:
        raise MalformedCheckpoint(
            f"{head.kind} of length {head.value:,} at offset {at:,} runs past the end of the file"
        )
    return head


def read_flax_msgpack(source: ByteSource) -> FileScan:
    cur = _Cursor(source)
    tensors = walk_flax_msgpack(cur)
    if cur.remaining:
        raise MalformedCheckpoint(f"{cur.remaining:,} trailing bytes after the top-level map")
    unknown = sorted({t.dtype for t in tensors if t.dtype not in dtypes.DTYPES})
    findings: tuple[Finding, ...] = ()
    if unknown:
        first = next(t.name for t in tensors if t.dtype in unknown)
        count = sum(t.dtype in unknown for t in tensors)
        findings = (make_finding(
            "CG005", source.name,
            f"unknown dtype(s) {', '.join(map(repr, unknown))} on {count} tensor(s), e.g. {first!r}",
            tensor=first,
        ),)
    return FileScan(path=source.name, format="flax-msgpack", size=source.size,
                    tensors=tuple(tensors), findings=findings, metadata={},
                    bytes_read=cur.bytes_read)


@dataclass(slots=True)  # mutable: the walk advances index, collects keys and clears peeked
class _Frame:
    path: tuple[str, ...]
    count: int
    is_map: bool = True
    index: int = 0
    keys: set[str] = field(default_factory=set)
    peeked: str | None = None  # a map's first key, read to spot a chunked array


def chunk_ranges(source: ByteSource) -> dict[str, list[tuple[int, int]]]:
    """Each chunked leaf's chunks as absolute (start, end) byte ranges, in order, by name: what a reader
    of its values needs (such a leaf has no single range).  One walk of the file with every check the
    scan makes (keys in order, one dtype, sizes adding up to the shape)."""
    chunks: dict[str, list[tuple[int, int]]] = {}
    walk_flax_msgpack(_Cursor(source), chunks=chunks)
    return chunks


def walk_flax_msgpack(cur: _Cursor, *, chunks: dict[str, list[tuple[int, int]]] | None = None
                      ) -> list[TensorInfo]:
    """All tensors of the tree, by an explicit stack capped at MAX_DEPTH (no recursion).  ``chunks``: filled
    with each chunked leaf's byte ranges (``chunk_ranges``)."""
    head = _read_head(cur)
    if head.kind != "map":
        raise MalformedCheckpoint(f"top level is a msgpack {head.kind}, not a map")
    if head.value > MAX_ENTRIES:
        raise MalformedCheckpoint(f"more than {MAX_ENTRIES:,} map/array entries")
    entries = head.value
    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    stack = [_Frame((), head.value)]
    _peek_first_key(cur, stack[0])
    if stack[0].peeked == CHUNKED_MARKER:
        raise MalformedCheckpoint("top level is a single chunked array, not a tree")
    while stack:
        frame = stack[-1]
        if frame.index == frame.count:
            stack.pop()
            continue
        frame.index += 1
        if not frame.is_map:
            path = (*frame.path, str(frame.index - 1))
        elif frame.peeked is not None:
            path, frame.peeked = (*frame.path, frame.peeked), None
        else:
            path = (*frame.path, _read_key(cur, frame))
        head = _read_head(cur)
        if head.kind in ("map", "array"):
            if len(stack) >= MAX_DEPTH:
                raise MalformedCheckpoint(f"nesting deeper than {MAX_DEPTH} levels")
            entries += head.value
            if entries > MAX_ENTRIES:
                raise MalformedCheckpoint(f"more than {MAX_ENTRIES:,} map/array entries")
            child = _Frame(path, head.value, is_map=head.kind == "map")
            if child.is_map:
                _peek_first_key(cur, child)
            if child.peeked == CHUNKED_MARKER:
                tensor = _read_chunked(cur, head.value, "/".join(path), source=cur.source.name, ranges=chunks)
            else:
                stack.append(child)
                continue
        elif head.kind == "ext" and head.ext_type in (EXT_NDARRAY, EXT_NPSCALAR):
            tensor = _read_array_ext(cur, head.value, "/".join(path), source=cur.source.name)
        else:
            _skip_leaf(cur, head)
            continue
        if tensor.name in seen:
            raise MalformedCheckpoint(f"two tensors are named {tensor.name!r}")
        seen.add(tensor.name)
        tensors.append(tensor)
    return tensors


def _peek_first_key(cur: _Cursor, frame: _Frame) -> None:
    if frame.count:
        frame.peeked = _read_key(cur, frame, allow_marker=True)


def _read_key(cur: _Cursor, frame: _Frame, *, allow_marker: bool = False) -> str:
    where = "/".join(frame.path) or "the top level"
    head = _read_head(cur)
    if head.kind != "str":
        raise MalformedCheckpoint(f"a map key under {where} is a msgpack {head.kind}, not a string")
    if head.value > MAX_KEY_BYTES:
        raise MalformedCheckpoint(
            f"a map key of {head.value:,} bytes exceeds the {MAX_KEY_BYTES:,}-byte limit")
    try:
        key = cur.take(head.value).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedCheckpoint(f"a map key under {where} is not UTF-8") from None
    if key == CHUNKED_MARKER and not allow_marker:
        raise MalformedCheckpoint(f"{CHUNKED_MARKER} is not the first key of its map under {where}")
    if key in frame.keys:
        raise MalformedCheckpoint(f"duplicate key {key!r} under {where}")
    frame.keys.add(key)
    return key


def _skip_leaf(cur: _Cursor, head: _Head) -> None:
    """Python scalars, strings, bytes and foreign ext types are not tensors: seek past them."""
    if head.kind == "ext" and head.ext_type < 0:  # msgpack's reserved types; flax writes none
        raise MalformedCheckpoint(f"reserved msgpack ext type {head.ext_type} at offset {cur.pos:,}")
    if head.kind == "ext" and head.ext_type == EXT_COMPLEX:
        _check_complex(cur, head.value)
    elif head.kind in ("str", "bin", "ext"):
        cur.skip(head.value)


def _check_complex(cur: _Cursor, length: int) -> None:
    end = cur.pos + length
    pair = _read_head(cur)
    if pair.kind != "array" or pair.value != 2:
        raise MalformedCheckpoint(f"complex value at offset {end - length:,} is not a [real, imag] pair")
    for _ in range(2):
        if _read_head(cur).kind not in ("int", "float"):
            raise MalformedCheckpoint(f"complex value at offset {end - length:,} has a non-numeric part")
    if cur.pos != end:
        raise MalformedCheckpoint(f"complex value at offset {end - length:,} does not fill its ext")


def _read_array_ext(cur: _Cursor, length: int, name: str, *, source: str) -> TensorInfo:
    """``[shape, dtype.name, bin]`` inside an ext; the payload is skipped, never read."""
    end = cur.pos + length
    if _read_head(cur) != ("array", 3, 0):
        raise MalformedCheckpoint(f"tensor {name!r}: ext payload is not a [shape, dtype, bytes] list")
    shape = _read_shape(cur, name)
    dtype_head = _read_head(cur)
    if dtype_head.kind != "str" or not 0 < dtype_head.value <= 64:
        raise MalformedCheckpoint(f"tensor {name!r}: dtype is not a short string")
    dtype_name = cur.take(dtype_head.value).decode("ascii", errors="replace")
    if not all("!" <= c <= "~" for c in dtype_name):
        raise MalformedCheckpoint(f"tensor {name!r}: dtype name {dtype_name!r} is not printable ASCII")
    data = _read_head(cur)
    if data.kind != "bin":
        raise MalformedCheckpoint(f"tensor {name!r}: array bytes are a msgpack {data.kind}, not bin")
    start = cur.pos
    if start + data.value != end:
        raise MalformedCheckpoint(f"tensor {name!r}: array bytes do not end where its ext ends")
    cur.skip(data.value)
    code = dtypes.NUMPY_NAMES.get(dtype_name, dtype_name)
    _check_nbytes(name, code, shape, data.value)
    return TensorInfo(name, code, shape, source, start, end)


def _read_shape(cur: _Cursor, name: str) -> tuple[int, ...]:
    head = _read_head(cur)
    if head.kind != "array" or head.value > MAX_RANK:
        raise MalformedCheckpoint(f"tensor {name!r}: shape is not a list of at most {MAX_RANK} dims")
    shape = tuple(_read_head(cur) for _ in range(head.value))
    if not all(dim.kind == "int" and dim.value >= 0 for dim in shape):
        raise MalformedCheckpoint(f"tensor {name!r}: shape is not a list of non-negative integers")
    return tuple(dim.value for dim in shape)


def _check_nbytes(name: str, code: str, shape: tuple[int, ...], nbytes: int) -> None:
    info = dtypes.DTYPES.get(code)
    # numpy stores sub-byte floats (F4, F6_*) one element per byte.
    itemsize = (info.bits + 7) // 8 if info else EXTRA_ITEMSIZES.get(code)
    numel = prod(shape)
    if itemsize is None:  # unknown width: the bytes must still split evenly into elements
        ok = nbytes == 0 if numel == 0 else nbytes % numel == 0 and nbytes > 0
    else:
        ok = numel * itemsize == nbytes
    if not ok:
        raise MalformedCheckpoint(f"tensor {name!r}: {code}{list(shape)} does not match its {nbytes:,} bytes")


def _read_chunked(cur: _Cursor, count: int, name: str, *, source: str,
                  ranges: dict[str, list[tuple[int, int]]] | None = None) -> TensorInfo:
    """``{marker: true, "shape": {"0": d0, ...}, "chunks": {"0": ext, ...}}`` as one tensor."""
    if count != 3 or _read_head(cur) != ("bool", 1, 0):
        raise MalformedCheckpoint(f"tensor {name!r}: chunked array is not {{marker: true, shape, chunks}}")

    def dim(i: int, head: _Head) -> int:
        if head.kind != "int" or head.value < 0:
            raise MalformedCheckpoint(f"tensor {name!r}: chunked shape dim {i} is not a non-negative integer")
        return head.value

    def chunk(i: int, head: _Head) -> TensorInfo:
        if head.kind != "ext" or head.ext_type != EXT_NDARRAY:
            raise MalformedCheckpoint(f"tensor {name!r}: chunk {i} is not an array")
        return _read_array_ext(cur, head.value, f"{name} chunk {i}", source=source)

    frame = _Frame(tuple(name.split("/")), count, keys={CHUNKED_MARKER})
    shape: list[int] = []
    chunks: list[TensorInfo] = []
    for _ in range(2):
        key = _read_key(cur, frame)
        if key == "shape":
            shape = _read_numbered(cur, name, "shape", dim, limit=MAX_RANK)
        elif key == "chunks":
            chunks = _read_numbered(cur, name, "chunks", chunk, limit=None)
        else:
            raise MalformedCheckpoint(f"tensor {name!r}: unexpected key {key!r} in a chunked array")
    if not chunks or any(c.dtype != chunks[0].dtype or len(c.shape) != 1 for c in chunks):
        raise MalformedCheckpoint(f"tensor {name!r}: chunks must be 1-D arrays of one dtype")
    if sum(c.numel for c in chunks) != prod(shape):
        raise MalformedCheckpoint(f"tensor {name!r}: chunks do not add up to shape {shape}")
    if ranges is not None:
        ranges[name] = [(c.data_start, c.data_end) for c in chunks]  # type: ignore[misc]  # each chunk's data_start and data_end are set by the walk above
    return TensorInfo(name, chunks[0].dtype, tuple(shape), source)


def _read_numbered(cur: _Cursor, name: str, what: str, read_entry: Callable[[int, _Head], T],
                   *, limit: int | None) -> list[T]:
    """A ``{"0": v0, "1": v1, ...}`` map, keys in order, each value read by ``read_entry``."""
    head = _read_head(cur)
    if head.kind != "map" or (limit is not None and head.value > limit):
        most = "" if limit is None else f" of at most {limit} entries"
        raise MalformedCheckpoint(f"tensor {name!r}: chunked {what} is not a map{most}")
    entries = []
    for i in range(head.value):
        key = _read_head(cur)
        if key.kind != "str" or key.value > 20 or cur.take(key.value) != str(i).encode():
            raise MalformedCheckpoint(f"tensor {name!r}: chunked {what} keys are not 0, 1, 2, ... in order")
        entries.append(read_entry(i, _read_head(cur)))
    return entries
