"""The bytes around tensor bodies: a safetensors header, and the msgpack framing ``flax.serialization`` writes.

safetensors: an 8-byte length, the JSON header (offsets relative to the data buffer), space
padding to 8 bytes.  Flax msgpack: a leaf is ``ExtType(1, packb([shape, dtype.name, C-order
bytes]))``; leaves over ``MAX_CHUNK_SIZE`` bytes become a chunked-array map.  The framing (map
headers, keys, ext headers with 32-bit lengths) is computed from the planned shape and dtype
alone, so the writer puts it around tensor bytes that stream past in bands: nothing is ever
packed into a msgpack buffer.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from math import prod
from typing import Any

from guard import dtypes

Key = tuple[str, ...]
ALIGNMENT = 8  # safetensors writers pad the header so the data buffer is 8-byte aligned
MAX_CHUNK_SIZE = 2**30  # flax.serialization.MAX_CHUNK_SIZE
CHUNKED_MARKER = "__msgpack_chunked_array__"
EXT_NDARRAY = 1


def safetensors_header(entries: Sequence[tuple[str, str, tuple[int, ...]]],
                       metadata: dict[str, str]) -> bytes:
    """The header (length prefix, JSON, space padding) for tensors laid out in the given order."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, code, shape in entries:
        size = dtypes.nbytes(code, _numel(shape)) or 0
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % ALIGNMENT)
    return len(raw).to_bytes(8, "little") + raw


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


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
