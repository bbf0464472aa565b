"""Flax msgpack checkpoints.  (Being written.)"""

from __future__ import annotations

from guard.errors import MalformedCheckpoint
from guard.sources import ByteSource
from guard.tensors import FileScan


def read_flax_msgpack(source: ByteSource) -> FileScan:
    raise MalformedCheckpoint("flax msgpack reader not implemented yet")
