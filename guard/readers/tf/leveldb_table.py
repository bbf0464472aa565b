"""LevelDB-format tables (TensorFlow's ``tensorflow/core/lib/io/table_format.txt``), walked in memory.

A table is data blocks, a metaindex block, an index block and a 48-byte footer:
the two block handles (varint offset and size), padding, and the magic
0xdb4775248b80fb57.  Each block is followed by a 5-byte trailer (compression
type, masked crc32c of the block and that type byte); TensorFlow checks the
crc of every block it reads, so we do too.  A block holds entries (shared key
prefix length, the rest of the key, the value) and ends with its restart array
(uint32 offsets of entries that start a fresh key, then their count).

Only uncompressed blocks are read: TensorFlow's tensor bundle writer sets
``kNoCompression`` on its index (tensor_bundle.cc: "the metadata file is small"),
so a snappy block in a bundle is a file TensorFlow did not write.  The metaindex
block is not read (TensorFlow's Table::Open reads only the index block).
Values are returned as spans of the file, so a protobuf walker reads them in place.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from guard.errors import MalformedCheckpoint

FOOTER = 48
MAGIC = 0xDB4775248B80FB57
MAGIC_BYTES = struct.pack("<Q", MAGIC)
TRAILER = 5
_U32 = struct.Struct("<I")


def _crc_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC_TABLE = _crc_table()


def crc32c(data: bytes | memoryview) -> int:
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes | memoryview) -> int:
    """LevelDB stores crcs masked, so that a crc of data holding crcs is not degenerate."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(data: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    result = 0
    for i in range(10):
        if pos + i >= end:
            raise MalformedCheckpoint(f"{what}: varint at offset {pos:,} runs past its block")
        byte = data[pos + i]
        result |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return result, pos + i + 1
    raise MalformedCheckpoint(f"{what}: varint at offset {pos:,} is longer than 10 bytes")


def read_footer(data: bytes) -> tuple[tuple[int, int], tuple[int, int]]:
    """(metaindex handle, index handle) as (offset, size)."""
    if len(data) < FOOTER:
        raise MalformedCheckpoint(f"table of {len(data):,} bytes is shorter than its 48-byte footer (truncated?)")
    start = len(data) - FOOTER
    if data[-8:] != MAGIC_BYTES:
        raise MalformedCheckpoint("no LevelDB table magic at the end of the file (truncated, or not a TF index)")
    end = len(data) - 8
    meta_offset, pos = varint(data, start, end, "footer")
    meta_size, pos = varint(data, pos, end, "footer")
    index_offset, pos = varint(data, pos, end, "footer")
    index_size, pos = varint(data, pos, end, "footer")
    return (meta_offset, meta_size), (index_offset, index_size)


def block_span(data: bytes, handle: tuple[int, int], what: str) -> tuple[int, int]:
    """Check a block's trailer (compression type, crc) and return its contents' span."""
    offset, size = handle
    limit = len(data) - FOOTER
    if offset > limit or size > limit - offset or offset + size + TRAILER > limit:
        raise MalformedCheckpoint(f"{what} at offset {offset:,} ({size:,} bytes) runs past the end of the table")
    end = offset + size
    kind = data[end]
    (stored,) = _U32.unpack_from(data, end + 1)
    if masked_crc(memoryview(data)[offset : end + 1]) != stored:
        raise MalformedCheckpoint(f"{what} at offset {offset:,} does not match its crc32c (corrupted)")
    if kind != 0:
        name = "snappy" if kind == 1 else f"type {kind}"
        raise MalformedCheckpoint(f"{what} at offset {offset:,} is {name}-compressed; TensorFlow writes bundle "
                                  "indexes uncompressed")
    return offset, end


def block_entries(data: bytes, span: tuple[int, int], what: str) -> Iterator[tuple[bytes, int, int]]:
    """(key, value start, value end) of each entry, with the restart array checked.

    The restart array must be ascending offsets of entries that share no prefix,
    the first at 0: LevelDB seeks through it, so a block whose restarts point
    elsewhere would be read differently by a seek than by a scan.
    """
    start, end = span
    if end - start < 4:
        raise MalformedCheckpoint(f"{what} at offset {start:,} is too short for its restart count")
    (count,) = _U32.unpack_from(data, end - 4)
    if count == 0 or count > (end - start - 4) // 4:
        raise MalformedCheckpoint(f"{what} at offset {start:,} has a bad restart array ({count:,} restarts)")
    entries_end = end - 4 - 4 * count
    restarts = [start + r for (r,) in _U32.iter_unpack(data[entries_end : end - 4])]
    if restarts[0] != start or any(b <= a for a, b in zip(restarts, restarts[1:])) or restarts[-1] >= max(
            entries_end, start + 1):
        raise MalformedCheckpoint(f"{what} at offset {start:,} has a bad restart array")
    next_restart = 0
    pos, key = start, b""
    while pos < entries_end:
        shared, pos_ = varint(data, pos, entries_end, what)
        unshared, pos_ = varint(data, pos_, entries_end, what)
        length, pos_ = varint(data, pos_, entries_end, what)
        at_restart = next_restart < count and restarts[next_restart] == pos
        if at_restart:
            next_restart += 1
        elif next_restart < count and restarts[next_restart] < pos:
            raise MalformedCheckpoint(f"{what} at offset {start:,}: a restart point is not at an entry")
        if shared > len(key) or (at_restart and shared) or unshared + length > entries_end - pos_:
            raise MalformedCheckpoint(f"{what} at offset {start:,}: bad entry at offset {pos:,}")
        key = key[:shared] + data[pos_ : pos_ + unshared]
        value = pos_ + unshared
        yield key, value, value + length
        pos = value + length
    if next_restart != count and entries_end > start:
        raise MalformedCheckpoint(f"{what} at offset {start:,}: a restart point is not at an entry")


def table_entries(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """Every entry of the table, in order, through the index block."""
    _meta, index = read_footer(data)
    index_span = block_span(data, index, "index block")
    for n, (_key, value, value_end) in enumerate(block_entries(data, index_span, "index block")):
        offset, pos = varint(data, value, value_end, "block handle")
        size, pos = varint(data, pos, value_end, "block handle")
        span = block_span(data, (offset, size), f"data block {n}")
        yield from block_entries(data, span, f"data block {n}")
