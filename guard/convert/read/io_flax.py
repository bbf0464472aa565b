"""Flax msgpack files, in the layout ``flax.serialization`` writes and transformers reads.

A leaf is ``ExtType(1, packb([shape, dtype.name, C-order bytes]))``; leaves over
``MAX_CHUNK_SIZE`` bytes become a chunked-array map.  The framing (map headers, keys,
ext headers with 32-bit lengths) is computed from the planned shape and dtype alone,
so the converter writes it around tensor bytes that stream past in bands: nothing
is ever packed into a msgpack buffer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from guard.convert.read.io_torch import OneFileCache
from guard.errors import MalformedCheckpoint
from guard.tensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np


def _restore_file(path: Path) -> Any:
    from flax.serialization import msgpack_restore

    try:
        return msgpack_restore(path.read_bytes())
    except Exception as exc:  # msgpack raises a zoo of types on hostile bytes; all mean "unreadable"
        raise MalformedCheckpoint(f"cannot decode msgpack: {exc}") from None


class FlaxChunkedLoader:
    """For chunked leaves, which have no single byte range: each read chunk by chunk into one array
    (``guard.convert.read.flax_chunks``: memory is the array).  A leaf whose chunks are not where its
    header says is decoded with its whole file instead (one shard held), for flax's own verdict."""

    def __init__(self) -> None:
        self._cache = OneFileCache(_restore_file)

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        from guard.convert.read.flax_chunks import NoChunks, read_chunked

        try:
            return read_chunked(info)
        except NoChunks:
            pass
        node = self._cache.get(Path(info.file))
        for part in info.name.split("/"):
            node = node[part]
        return np.array(node, copy=True)


