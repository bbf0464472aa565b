"""Flax msgpack files, in the layout ``flax.serialization`` writes and transformers reads.

A leaf is ``ExtType(1, packb([shape, dtype.name, C-order bytes]))``; leaves over
``MAX_CHUNK_SIZE`` bytes become a chunked-array map.  The framing (map headers, keys,
ext headers with 32-bit lengths) is computed from the planned shape and dtype alone,
so the converter writes it around tensor bytes that stream past in bands: nothing
is ever packed into a msgpack buffer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from guard.convert.read.io_torch import OneFileCache
from guard.errors import MalformedCheckpoint
from guard.tensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np


def _chunk_ranges(path: Path) -> dict[str, list[tuple[int, int]]]:
    from guard.readers.flax_msgpack import chunk_ranges
    from guard.sources import LocalFile

    with LocalFile(path) as source:
        return chunk_ranges(source)


class FlaxChunkedLoader:
    """For chunked leaves, which have no single byte range: each read chunk by chunk into one array
    (``guard.convert.read.flax_chunks``: memory is the array), from the byte ranges the scanner's walk of
    its file gives (one walk per file, kept while its leaves are read)."""

    def __init__(self) -> None:
        self._ranges = OneFileCache(_chunk_ranges)

    def load(self, info: TensorInfo) -> np.ndarray:
        from guard.convert.read.flax_chunks import read_chunked

        ranges = self._ranges.get(Path(info.file)).get(info.name)
        if ranges is None:  # the scan saw a chunked leaf there: the file changed since
            raise MalformedCheckpoint(f"{info.file}: {info.name} is no longer a chunked array")
        return read_chunked(info, ranges)


