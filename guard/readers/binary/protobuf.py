"""Protobuf wire format, walked in place through a Window: no generated classes, no ``protobuf``.

A message is a span of the file; ``fields`` yields its fields with their
payload's position, so a 1 GB ``raw_data`` is skipped by its length, never read.
``validate`` checks a span the way the protobuf parser does when ``onnx.load``
parses a model: every known sub-message is parsed too (its wire format must
hold), packed repeated numbers must be whole, unknown fields and groups must be
well formed, and nesting stops at protobuf's recursion limit of 100.  What the
parser tolerates is tolerated: unknown fields, a known field sent with another
wire type (kept as unknown), strings that are not UTF-8 (proto2).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from guard.errors import MalformedCheckpoint
from guard.readers.binary.window import Window
from guard.records import Record

VARINT, FIXED64, LEN, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5
MAX_DEPTH = 100  # protobuf's default recursion limit (upb and the C++ parser)
MAX_LENGTH = 2**31 - 1  # the parser's limit for one length-delimited field
_CHUNK = 64 * 1024
_LONG_VARINT = re.compile(rb"[\x80-\xff]{10}")
_NUMERIC_WIRE = {"varint": VARINT, "fixed32": FIXED32, "fixed64": FIXED64}

# message -> {field number: kind}; a kind is a message name, or "varint" / "fixed32" /
# "fixed64" / "bytes", with "*" for a repeated field (repeated numbers may come packed).
Schema = Mapping[str, Mapping[int, str]]


class Field(Record):
    number: int
    wire: int
    value: int  # a varint's value, else where the payload starts
    end: int  # where the payload (and the field) ends


class Wire:
    def __init__(self, window: Window, schema: Schema) -> None:
        self.win = window
        self.schema = schema

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        at = pos - self.win.start
        if pos < end and 0 <= at < len(self.win.data):  # one buffered byte: most tags and lengths
            byte = self.win.data[at]
            if byte < 0x80:
                return byte, pos + 1
        n = min(10, end - pos)
        at = self.win.need(pos, n, "varint")
        data = self.win.data
        result = 0
        for i in range(n):
            byte = data[at + i]
            result |= (byte & 0x7F) << (7 * i)
            if byte < 0x80:
                return result & 0xFFFFFFFFFFFFFFFF, pos + i + 1
        if n == 10:
            raise MalformedCheckpoint(f"varint at offset {pos:,} is longer than 10 bytes")
        raise MalformedCheckpoint(f"varint at offset {pos:,} runs past the end of its message")

    def fields(self, start: int, end: int, depth: int) -> Iterator[Field]:
        pos = start
        while pos < end:
            tag, body = self.varint(pos, end)
            number, wire = tag >> 3, tag & 7
            if number == 0 or tag > 0xFFFFFFFF:
                raise MalformedCheckpoint(f"invalid protobuf tag {tag} at offset {pos:,}")
            if wire == VARINT:
                value, pos = self.varint(body, end)
                yield Field(number, wire, value, pos)
                continue
            if wire == LEN:
                length, body = self.varint(body, end)
                if length > min(MAX_LENGTH, end - body):
                    raise MalformedCheckpoint(f"field {number} at offset {pos:,} has length {length:,}, "
                                              "past the end of its message")
                pos = body + length
            elif wire in (FIXED64, FIXED32):
                pos = body + (8 if wire == FIXED64 else 4)
                if pos > end:
                    raise MalformedCheckpoint(f"field {number} runs past the end of its message")
            elif wire == START_GROUP:
                pos = self._skip_group(number, body, end, depth + 1)
            else:
                raise MalformedCheckpoint(f"unexpected protobuf wire type {wire} at offset {pos:,}")
            yield Field(number, wire, body, pos)

    def _skip_group(self, number: int, pos: int, end: int, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise MalformedCheckpoint(f"protobuf groups nest more than {MAX_DEPTH} deep")
        while pos < end:
            tag, after = self.varint(pos, end)
            if tag & 7 == END_GROUP:
                if tag >> 3 != number:
                    raise MalformedCheckpoint(f"mismatched protobuf end-group at offset {pos:,}")
                return after
            pos = next(self.fields(pos, end, depth)).end  # one field (a nested group is skipped whole)
        raise MalformedCheckpoint("protobuf group without its end")

    def messages(self, field: Field, kind: str) -> bool:
        """Whether ``field`` carries the message or packed numbers its schema kind says."""
        return field.wire == LEN and kind.rstrip("*") in self.schema

    def validate(self, message: str, start: int, end: int, depth: int) -> None:
        """Parse the span as ``message`` would be parsed, discarding everything."""
        if depth > MAX_DEPTH:
            raise MalformedCheckpoint(f"protobuf messages nest more than {MAX_DEPTH} deep")
        known = self.schema[message]
        for field in self.fields(start, end, depth):
            self.validate_field(known.get(field.number), field, depth)

    def validate_field(self, kind: str | None, field: Field, depth: int) -> None:
        if kind is None or field.wire != LEN:
            return
        name = kind.rstrip("*")
        if name in self.schema:
            self.validate(name, field.value, field.end, depth + 1)
        elif kind.endswith("*") and name in _NUMERIC_WIRE:
            self.packed_count(name, field.value, field.end)

    def packed_count(self, kind: str, start: int, end: int) -> int:
        """Elements in a packed repeated field, checked whole."""
        length = end - start
        if kind != "varint":
            width = 4 if kind == "fixed32" else 8
            if length % width:
                raise MalformedCheckpoint(f"packed field at offset {start:,} is not a whole number of values")
            return length // width
        count, pos, last, tail = 0, start, 0, b""
        while pos < end:
            n = min(_CHUNK, end - pos)
            at = self.win.need(pos, n, "packed field")
            chunk = self.win.data[at : at + n]
            if _LONG_VARINT.search(tail + chunk):
                raise MalformedCheckpoint(f"packed field at offset {start:,} holds a varint of over 10 bytes")
            count += n - len(chunk.translate(None, bytes(range(128))))
            last, tail = chunk[-1], chunk[-9:]
            pos += n
        if length and last >= 0x80:
            raise MalformedCheckpoint(f"packed field at offset {start:,} ends inside a varint")
        return count

    def number_kind(self, kind: str, field: Field) -> bool:
        """Whether a scalar numeric field arrived with its own wire type (else protobuf keeps it unknown)."""
        return _NUMERIC_WIRE.get(kind.rstrip("*")) == field.wire
