"""Flatbuffer tables read in place over a ByteSource, with the checks of flatbuffers' Verifier.

No generated code and no ``flatbuffers`` package: a reader names fields by their
index in the schema (``field(table, 0)`` is a table's first field).  Every
position is bounds-checked against ``limit`` (the flatbuffer's own extent; data a
file keeps after it, such as TFLite's >2 GB buffers, is addressed separately),
aligned as the Verifier requires, and each table visit counts towards
``MAX_TABLES``.  Offsets only point forwards (uoffset_t is unsigned) and a reader
walks a fixed schema depth, so a loop in the file cannot make a walk loop: at
worst it visits one table many times, and ``MAX_TABLES`` stops that.

Reads go through a small block cache: a file of up to ``WHOLE`` bytes is read in
one request, a bigger one in ``BLOCK``-sized pieces around what a walk touches.

API (small on purpose, shared by the TFLite and ExecuTorch readers):
``FlatBuffer(source, limit=None)``; ``.root()``; ``.identifier()``;
``.scalar(table, i, fmt, default)``; ``.table(table, i)``; ``.vector(table, i, width)``
-> (first element, count); ``.numbers(table, i, fmt)``; ``.tables(table, i)``;
``.string(table, i, max_bytes)``; ``.read(pos, n)``.  Tables are positions (ints).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from guard.errors import MalformedCheckpoint
from guard.sources import ByteSource

WHOLE = 1024 * 1024  # read a file this small in one request
BLOCK = 16 * 1024
MAX_BLOCKS = 512  # cached blocks (8 MiB)
MAX_TABLES = 1_000_000  # flatbuffers' Verifier default (max_tables)
_U16, _U32, _I32 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<i")


class FlatBuffer:
    def __init__(self, source: ByteSource, *, limit: int | None = None) -> None:
        self.source = source
        self.limit = source.size if limit is None else min(limit, source.size)
        self._blocks: dict[int, bytes] = {}
        self._whole = source.read_at(0, source.size) if source.size <= WHOLE else None
        self.tables_seen = 0

    def read(self, pos: int, n: int, what: str = "flatbuffer") -> bytes:
        if pos < 0 or n < 0 or pos + n > self.limit:
            raise MalformedCheckpoint(f"{what} at offset {pos:,} ({n:,} bytes) points past the end of the "
                                      f"flatbuffer ({self.limit:,} bytes)")
        if self._whole is not None:
            return self._whole[pos : pos + n]
        first, last = pos // BLOCK, (pos + n - 1) // BLOCK if n else pos // BLOCK
        if last - first > 4:  # a long run (a vector of many tables): read it directly, uncached
            return self.source.read_at(pos, n)
        data = b"".join(self._block(b) for b in range(first, last + 1))
        at = pos - first * BLOCK
        return data[at : at + n]

    def _block(self, index: int) -> bytes:
        block = self._blocks.get(index)
        if block is None:
            if len(self._blocks) >= MAX_BLOCKS:
                del self._blocks[next(iter(self._blocks))]
            start = index * BLOCK
            block = self._blocks[index] = self.source.read_at(start, min(BLOCK, self.source.size - start))
        return block

    def _u32(self, pos: int, what: str) -> int:
        if pos % 4:
            raise MalformedCheckpoint(f"{what} at offset {pos:,} is not 4-byte aligned")
        return int(_U32.unpack(self.read(pos, 4, what))[0])

    def _follow(self, pos: int, what: str) -> int:
        target = pos + self._u32(pos, what)
        if target >= self.limit:
            raise MalformedCheckpoint(f"{what} at offset {pos:,} points past the end of the flatbuffer")
        return target

    def identifier(self) -> bytes:
        return self.read(4, 4, "file identifier")

    def root(self) -> int:
        return self._check_table(self._follow(0, "root offset"))

    def _check_table(self, table: int) -> int:
        self.tables_seen += 1
        if self.tables_seen > MAX_TABLES:
            raise MalformedCheckpoint(f"flatbuffer visits more than {MAX_TABLES:,} tables (offsets that loop?)")
        if table % 4:
            raise MalformedCheckpoint(f"table at offset {table:,} is not 4-byte aligned")
        vtable = table - int(_I32.unpack(self.read(table, 4, "table"))[0])
        if vtable % 2:
            raise MalformedCheckpoint(f"vtable at offset {vtable:,} is not 2-byte aligned")
        size = int(_U16.unpack(self.read(vtable, 2, "vtable"))[0])
        if size % 2:
            raise MalformedCheckpoint(f"vtable at offset {vtable:,} has odd size {size}")
        self.read(vtable, max(size, 2), "vtable")  # the whole vtable in bounds; 0 or 2 bytes: a table of no fields
        return table  # fields are bounds-checked one by one (_field), as the Verifier does

    def _field(self, table: int, index: int, width: int) -> int | None:
        """The absolute position of a field's inline value, None when absent."""
        vtable = table - int(_I32.unpack(self.read(table, 4, "table"))[0])
        size = int(_U16.unpack(self.read(vtable, 2, "vtable"))[0])
        slot = 4 + 2 * index
        if slot + 2 > size:
            return None
        offset = int(_U16.unpack(self.read(vtable + slot, 2, "vtable"))[0])
        if offset == 0:
            return None
        self.read(table + offset, width, f"field {index}")  # in the buffer (the Verifier ignores the inline size)
        if (table + offset) % min(width, 8):
            raise MalformedCheckpoint(f"field {index} of the table at offset {table:,} is misaligned")
        return table + offset

    def scalar(self, table: int, index: int, fmt: str, default: int | float) -> int | float:
        layout = struct.Struct("<" + fmt)
        pos = self._field(table, index, layout.size)
        if pos is None:
            return default
        value: int | float = layout.unpack(self.read(pos, layout.size))[0]
        return value

    def table(self, table: int, index: int) -> int | None:
        pos = self._field(table, index, 4)
        return None if pos is None else self._check_table(self._follow(pos, f"table field {index}"))

    def vector(self, table: int, index: int, width: int) -> tuple[int, int] | None:
        """(position of the first element, count) of a vector field; elements must fit and align."""
        pos = self._field(table, index, 4)
        if pos is None:
            return None
        start = self._follow(pos, f"vector field {index}")
        count = self._u32(start, "vector length")
        first = start + 4
        if count * width > self.limit - first:
            raise MalformedCheckpoint(f"vector at offset {start:,} claims {count:,} elements of {width} bytes, "
                                      "past the end of the flatbuffer")
        if width > 4 and first % width:
            raise MalformedCheckpoint(f"vector at offset {start:,} is misaligned for {width}-byte elements")
        return first, count

    def numbers(self, table: int, index: int, fmt: str) -> list[int | float]:
        layout = struct.Struct("<" + fmt)
        found = self.vector(table, index, layout.size)
        if found is None:
            return []
        first, count = found
        return [v[0] for v in layout.iter_unpack(self.read(first, count * layout.size))]

    def tables(self, table: int, index: int) -> Iterator[int]:
        found = self.vector(table, index, 4)
        if found is None:
            return
        first, count = found
        offsets = self.read(first, 4 * count, "vector of tables")
        for i, (offset,) in enumerate(_U32.iter_unpack(offsets)):
            target = first + 4 * i + offset
            if target >= self.limit:
                raise MalformedCheckpoint(f"table {i} of the vector at offset {first - 4:,} points past the end")
            yield self._check_table(target)

    def string(self, table: int, index: int, max_bytes: int) -> str | None:
        found = self.vector(table, index, 1)
        if found is None:
            return None
        first, count = found
        if self.read(first + count, 1, "string terminator") != b"\x00":
            raise MalformedCheckpoint(f"string at offset {first - 4:,} is not zero-terminated")
        return self.read(first, min(count, max_bytes)).decode("utf-8", "backslashreplace")
