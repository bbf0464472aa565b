"""Flax msgpack files, in the layout ``flax.serialization`` writes and transformers reads.

A leaf is ``ExtType(1, packb([shape, dtype.name, C-order bytes]))``; leaves over
``MAX_CHUNK_SIZE`` bytes become a chunked-array map.  The writer emits the map
headers and ext headers itself and then the array bytes straight from the
array's buffer, so a tensor is never copied into a msgpack buffer.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

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


def write_flax_msgpack(fh: IO[bytes], entries: Sequence[Key],
                       load: Callable[[Key], np.ndarray]) -> None:
    """Write the tree of ``entries`` (leaf paths), in sorted order, loading each leaf as it is reached."""
    import msgpack

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
    packer = msgpack.Packer(use_bin_type=True)

    def walk(node: dict[str, Any], prefix: Key) -> None:
        fh.write(packer.pack_map_header(len(node)))
        for name in sorted(node):
            fh.write(packer.pack(name))
            child = node[name]
            if isinstance(child, dict):
                walk(child, (*prefix, name))
            else:
                write_leaf(fh, load((*prefix, name)), packer=packer)

    walk(tree, ())


def write_leaf(fh: IO[bytes], array: np.ndarray, *, packer: Any) -> None:
    import numpy as np

    array = np.ascontiguousarray(array).reshape(np.shape(array))  # keep 0-d parameters (CLIP logit_scale) 0-d
    if array.nbytes <= MAX_CHUNK_SIZE:
        _write_ndarray_ext(fh, array, packer=packer)
        return
    # flax._chunk: {"__msgpack_chunked_array__": True, "shape": {"0": d0, ...}, "chunks": {"0": ext, ...}}
    per_chunk = max(1, MAX_CHUNK_SIZE // array.dtype.itemsize)
    flat = array.reshape(-1)
    starts = range(0, flat.size, per_chunk)
    fh.write(packer.pack_map_header(3))
    fh.write(packer.pack(CHUNKED_MARKER) + packer.pack(True))
    fh.write(packer.pack("shape") + packer.pack({str(i): d for i, d in enumerate(array.shape)}))
    fh.write(packer.pack("chunks") + packer.pack_map_header(len(starts)))
    for i, start in enumerate(starts):
        fh.write(packer.pack(str(i)))
        _write_ndarray_ext(fh, flat[start:start + per_chunk], packer=packer)


def _write_ndarray_ext(fh: IO[bytes], array: np.ndarray, *, packer: Any) -> None:
    import numpy as np

    inner = (b"\x93" + packer.pack(list(array.shape)) + packer.pack(array.dtype.name)
             + b"\xc6" + struct.pack(">I", array.nbytes))
    fh.write(b"\xc9" + struct.pack(">I", len(inner) + array.nbytes) + bytes([EXT_NDARRAY]))
    fh.write(inner)
    fh.write(array.reshape(-1).view(np.uint8).data)
