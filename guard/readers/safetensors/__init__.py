"""safetensors: the 8-byte length, the JSON header, nothing else.

``reference`` is the plain reading and the definition of what a header means; ``fast.read_fast`` is
the one entry to the fast readings (templates, the pattern, the parsed header in columns), which take
the headers they can prove they read as the reference does and leave it every other one.
"""

from __future__ import annotations

from guard.readers.safetensors.fast import read_fast
from guard.readers.safetensors.reference import (
    MAX_HEADER_SIZE,
    framed,
    parse_header,
    read_parsed,
    read_safetensors_header,
)
from guard.sources import ByteSource
from guard.tensors import FileScan

__all__ = ["MAX_HEADER_SIZE", "parse_header", "read_safetensors", "read_safetensors_header"]


def read_safetensors(source: ByteSource) -> FileScan:
    length, raw = framed(source)
    scan = read_fast(raw, source, length)
    return scan if scan is not None else read_parsed(raw, source, length)
