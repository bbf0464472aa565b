"""Flax msgpack files, in the layout ``flax.serialization`` writes and transformers reads.

A leaf is ``ExtType(1, packb([shape, dtype.name, C-order bytes]))``; leaves over
``MAX_CHUNK_SIZE`` bytes become a chunked-array map.  The framing (map headers, keys,
ext headers with 32-bit lengths) is computed from the planned shape and dtype alone,
so the converter writes it around tensor bytes that stream past in bands: nothing
is ever packed into a msgpack buffer.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guard.convert.io_torch import OneFileCache
from guard.errors import MalformedCheckpoint
from guard.tensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np

MAX_CHUNK_SIZE = 2**30  # flax.serialization.MAX_CHUNK_SIZE
CHUNKED_MARKER = "__msgpack_chunked_array__"
EXT_NDARRAY = 1

Key = tuple[str, ...]


def _restore_file(path: Path) -> Any:
    from flax.serialization import msgpack_restore

    try:
        return msgpack_restore(path.read_bytes())
    except Exception as exc:  # msgpack raises a zoo of types on hostile bytes; all mean "unreadable"
        raise MalformedCheckpoint(f"cannot decode msgpack: {exc}") from None


class FlaxWholeFileLoader:
    """For chunked leaves, which have no single byte range: decode the file once (one shard)."""

    def __init__(self) -> None:
        self._cache = OneFileCache(_restore_file)

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        node = self._cache.get(Path(info.file))
        for part in info.name.split("/"):
            node = node[part]
        return np.array(node, copy=True)


def msgpack_tree(entries: Sequence[Key]) -> dict[str, Any]:
    """The nested maps of ``entries`` (leaf paths), leaves as None; a path both leaf and subtree is an error."""
    tree: dict[str, Any] = {}
    for key in entries:
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"{'/'.join(key)} is both a leaf and a subtree")
        if key[-1] in node:
            raise ValueError(f"{'/'.join(key)} appears twice")
        node[key[-1]] = None
    return tree


def walk_tree(tree: dict[str, Any], emit: Callable[[bytes], None], leaf: Callable[[Key], None]) -> None:
    """Emit the map framing depth-first in sorted key order (flax's own order); ``leaf`` writes each leaf."""
    import msgpack

    packer = msgpack.Packer(use_bin_type=True)

    def walk(node: dict[str, Any], prefix: Key) -> None:
        emit(packer.pack_map_header(len(node)))
        for name in sorted(node):
            emit(packer.pack(name))
            child = node[name]
            if isinstance(child, dict):
                walk(child, (*prefix, name))
            else:
                leaf((*prefix, name))

    walk(tree, ())


def leaf_segments(shape: tuple[int, ...], dtype_name: str, itemsize: int) -> list[tuple[bytes, int]]:
    """A leaf as (framing bytes, body byte count) pairs: one ndarray ext, or flax's chunked-array map."""
    import msgpack

    packer = msgpack.Packer(use_bin_type=True)
    numel = prod(shape)
    if numel * itemsize <= MAX_CHUNK_SIZE:
        return [(_ext_header(shape, dtype_name, numel * itemsize, packer), numel * itemsize)]
    # flax._chunk: {"__msgpack_chunked_array__": True, "shape": {"0": d0, ...}, "chunks": {"0": ext, ...}}
    per_chunk = max(1, MAX_CHUNK_SIZE // itemsize)
    starts = range(0, numel, per_chunk)
    head = (packer.pack_map_header(3) + packer.pack(CHUNKED_MARKER) + packer.pack(True)
            + packer.pack("shape") + packer.pack({str(i): d for i, d in enumerate(shape)})
            + packer.pack("chunks") + packer.pack_map_header(len(starts)))
    segments = []
    for i, start in enumerate(starts):
        count = min(per_chunk, numel - start)
        framing = packer.pack(str(i)) + _ext_header((count,), dtype_name, count * itemsize, packer)
        segments.append(((head if i == 0 else b"") + framing, count * itemsize))
    return segments


def _ext_header(shape: tuple[int, ...], dtype_name: str, nbytes: int, packer: Any) -> bytes:
    """``ExtType(1, packb([shape, dtype.name, data]))`` up to the data, with 32-bit lengths throughout."""
    inner = b"\x93" + packer.pack(list(shape)) + packer.pack(dtype_name) + b"\xc6" + struct.pack(">I", nbytes)
    return b"\xc9" + struct.pack(">I", len(inner) + nbytes) + bytes([EXT_NDARRAY]) + inner

