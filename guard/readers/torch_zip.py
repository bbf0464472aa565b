"""torch zip checkpoints (.bin/.pt/.pth): zip directory + data.pkl only.  (Being written.)"""

from __future__ import annotations

from guard.errors import MalformedCheckpoint
from guard.sources import ByteSource
from guard.tensors import FileScan


def read_torch_zip(source: ByteSource) -> FileScan:
    raise MalformedCheckpoint("torch zip reader not implemented yet")
