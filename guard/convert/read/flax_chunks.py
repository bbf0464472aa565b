"""A chunked Flax msgpack leaf, read chunk by chunk from its byte ranges.

``flax.serialization`` splits an array over 2**30 bytes into a map of 1-D chunks (a vocabulary
matrix of a 70B-wide model: 2.1 GB in bf16).  Such a leaf has no single byte range; decoding its
whole file to reach it (a shard of several GB, held decoded) made it the peak of a conversion or a
streamed parity run.  Here the scanner's own walk (``guard.readers.flax_msgpack.chunk_ranges``, once
per file, with all of its checks) gives each chunk's byte range, and the chunks' bytes are read
straight into one array: memory is the array itself.  Convert's Flax loader
(``guard.convert.read.io_flax``), which parity's streamed weights read through too, reads chunked
leaves here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from guard.errors import MalformedCheckpoint
from guard.tensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np


def read_chunked(info: TensorInfo, ranges: list[tuple[int, int]]) -> np.ndarray:
    """The leaf as one C-order array of its dtype and shape; each chunk's bytes (``ranges``) read into place."""
    import numpy as np

    from guard.write.bitviews import numpy_dtype
    from guard.write.produce import read_into

    out = np.empty(info.shape, numpy_dtype(info.dtype))
    view = out.reshape(-1).view(np.uint8).data  # memoryview(...), typed (numpy types __buffer__ from 3.12)
    done = 0
    with open(info.file, "rb", buffering=0) as fh:
        for start, end in ranges:
            if done + end - start > len(view):
                raise MalformedCheckpoint(f"{info.file}: {info.name}: chunks hold more than its shape")
            fh.seek(start)
            if read_into(fh, view[done:done + end - start]) < end - start:
                raise MalformedCheckpoint(f"{info.file}: {info.name}: chunk at {start:,} is truncated")
            done += end - start
    if done != len(view):
        raise MalformedCheckpoint(f"{info.file}: {info.name}: chunks hold {done:,} of its {len(view):,} bytes")
    return out
