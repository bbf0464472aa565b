"""A chunked Flax msgpack leaf, read chunk by chunk from its byte ranges.

``flax.serialization`` splits an array over 2**30 bytes into a map of 1-D chunks (a vocabulary
matrix of a 70B-wide model: 2.1 GB in bf16).  Such a leaf has no single byte range; decoding its
whole file to reach it (a shard of several GB, held decoded) made it the peak of a conversion or a
streamed parity run.  Here the scanner's own token reader walks to the leaf, seeking past every
other payload, and the chunks' bytes are read straight into one array: memory is the array itself.
Convert's Flax loader (``guard.convert.read.io_flax``) and parity's weights read chunked leaves here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from guard.readers.flax_msgpack import (  # the scanner's token reader: one parser of this format, not two
    EXT_NDARRAY,
    _Cursor,
    _Head,
    _read_array_ext,
    _read_head,
)
from guard.tensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np


class NoChunks(ValueError):
    """The leaf is not where, or not what, its header said."""


def chunk_ranges(info: TensorInfo) -> list[tuple[int, int]]:
    """The absolute (start, end) byte ranges of the leaf's chunks, in order."""
    from guard.sources import LocalFile

    with LocalFile(info.file) as source:
        cur = _Cursor(source)
        head = _read_head(cur)
        for part in info.name.split("/"):
            head = _find_key(cur, head, part, info.name)
        if head.kind != "map":
            raise NoChunks(f"{info.name} is a msgpack {head.kind}, not a chunked array")
        ranges: list[tuple[int, int]] = []
        for _ in range(head.value):
            key, value = _read_str(cur), _read_head(cur)
            if key != "chunks":  # the marker and the shape: the header already gave them
                _skip(cur, value)
                continue
            for i in range(value.value if value.kind == "map" else 0):
                _read_str(cur)
                ext = _read_head(cur)
                if ext.kind != "ext" or ext.ext_type != EXT_NDARRAY:
                    raise NoChunks(f"{info.name}: chunk {i} is not an array")
                piece = _read_array_ext(cur, ext.value, f"{info.name} chunk {i}", source=source.name)
                assert piece.data_start is not None and piece.data_end is not None
                ranges.append((piece.data_start, piece.data_end))
    return ranges


def read_chunked(info: TensorInfo) -> np.ndarray:
    """The leaf as one C-order array of its dtype and shape; each chunk's bytes read into place."""
    import numpy as np

    from guard.write.bitviews import numpy_dtype
    from guard.write.produce import read_into

    out = np.empty(info.shape, numpy_dtype(info.dtype))
    view = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    with open(info.file, "rb", buffering=0) as fh:
        for start, end in chunk_ranges(info):
            if done + end - start > len(view):
                raise NoChunks(f"{info.name}: chunks hold more than its shape")
            fh.seek(start)
            if read_into(fh, view[done:done + end - start]) < end - start:
                raise NoChunks(f"{info.name}: chunk at {start:,} is truncated")
            done += end - start
    if done != len(view):
        raise NoChunks(f"{info.name}: chunks hold {done:,} of its {len(view):,} bytes")
    return out


def _find_key(cur: _Cursor, head: _Head, key: str, name: str) -> _Head:
    """Inside the map ``head`` opens, the value under ``key`` (its head read); the siblings before it skipped."""
    if head.kind != "map":
        raise NoChunks(f"{name}: a msgpack {head.kind} where a map was expected")
    for _ in range(head.value):
        found, value = _read_str(cur), _read_head(cur)
        if found == key:
            return value
        _skip(cur, value)
    raise NoChunks(f"{name}: no key {key!r}")


def _read_str(cur: _Cursor) -> str:
    head = _read_head(cur)
    if head.kind != "str":
        raise NoChunks(f"a msgpack {head.kind} where a key was expected")
    return cur.take(head.value).decode("utf-8", errors="replace")


def _skip(cur: _Cursor, head: _Head) -> None:
    """Past one value whose head is read: payloads by seeking, containers entry by entry."""
    pending = 0
    while True:
        if head.kind == "map":
            pending += 2 * head.value
        elif head.kind == "array":
            pending += head.value
        elif head.kind in ("str", "bin", "ext"):
            cur.skip(head.value)
        if not pending:
            return
        pending -= 1
        head = _read_head(cur)
