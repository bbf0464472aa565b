"""torch legacy (non-zip) pickles.  (Being written.)"""

from __future__ import annotations

from guard.errors import MalformedCheckpoint
from guard.sources import ByteSource
from guard.tensors import FileScan


def read_torch_legacy(source: ByteSource) -> FileScan:
    raise MalformedCheckpoint("torch legacy reader not implemented yet")
