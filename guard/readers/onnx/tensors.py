"""ONNX TensorProto fields -> TensorInfo, with ``numpy_helper.to_array``'s checks; external data.

An external tensor (``data_location`` 1) names a file beside the model in its
``external_data`` entries (``location``, ``offset``, ``length``).  Its TensorInfo
points at that file, so a value scan reads it there; the reader lists the file in
``FileScan.companions`` and ``external_data_findings`` checks, once the directory
listing is known, that each file exists and holds each tensor's range.  A location
that is absolute or climbs out of the model's folder is refused: ``onnx`` refuses
it too, and it would make a scan read files the model does not own.

``read_tensor`` and ``read_sparse`` walk a TensorProto / SparseTensorProto in
place (``raw_data`` is a span, never read); ``constant_info`` turns a Constant
node's value attribute into a TensorInfo (``guard.readers.onnx.graph`` says which).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.readers.binary.protobuf import LEN, MAX_DEPTH, VARINT, Field, Wire
from guard.readers.onnx.schema import DATA_TYPES, SCHEMA, TYPED_FIELDS
from guard.tensors import FileScan, TensorInfo

MAX_RANK = 64  # numpy's limit: to_array cannot build more dims
MAX_NAME = 2**20  # bytes of a tensor name: a claimed 1 GB name is never read into memory
Spans = list[tuple[int, int]]
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass  # mutable: read_tensor fills it field by field as the message's fields arrive
class RawTensor:
    name: str = ""
    dims: list[int] = field(default_factory=list)
    data_type: int = 0
    raw: tuple[int, int] | None = None  # the raw_data payload's span in the file
    counts: dict[int, int] = field(default_factory=dict)  # typed field number -> values
    data_location: int = 0
    external: list[tuple[str, str]] = field(default_factory=list)
    segment: bool = False

    @property
    def location(self) -> str | None:
        return _external(self)[0] if self.data_location == 1 else None


@dataclass  # mutable: the attribute walk sets kind, tensor and dims, adds to present and counts
class ConstantValue:
    """A Constant node's value attribute as found: which one (its name) and what it holds."""

    kind: str = ""  # value, sparse_value, value_float, value_floats, value_int(s), value_string(s)
    tensor: RawTensor | None = None  # value, sparse_value
    dims: tuple[int, ...] | None = None  # sparse_value's dense dims
    present: set[int] = field(default_factory=set)  # singular fields sent: 2 f, 3 i, 4 s
    counts: dict[int, int] = field(default_factory=dict)  # values of the repeated 7 floats, 8 ints, 9 strings


# Constant's scalar and list attributes: (field, repeated, dtype); the operator defines their type
CONSTANT_FIELDS: dict[str, tuple[int, bool, str]] = {
    "value_float": (2, False, "F32"), "value_floats": (7, True, "F32"),
    "value_int": (3, False, "I64"), "value_ints": (8, True, "I64"),
    "value_string": (4, False, "STRING"), "value_strings": (9, True, "STRING"),
}


def has_constant(value: ConstantValue) -> bool:
    """Whether the attribute holds a Constant's value (an empty list attribute does: a 0-element tensor)."""
    if value.kind in ("value", "sparse_value"):
        return value.tensor is not None
    spec = CONSTANT_FIELDS.get(value.kind)
    return spec is not None and (spec[1] or spec[0] in value.present)


def constant_info(value: ConstantValue, name: str, path: str) -> tuple[TensorInfo, bool, RawTensor | None]:
    """(the tensor, whether its data type is unknown, its TensorProto) for a value ``has_constant`` accepts."""
    if value.tensor is not None:
        value.tensor.name = name
        info, unknown = tensor_info(value.tensor, path, dims=value.dims, what="Constant")
        return info, unknown, value.tensor
    number, repeated, code = CONSTANT_FIELDS[value.kind]
    return TensorInfo(name, code, (value.counts.get(number, 0),) if repeated else (), path), False, None


def tensor_info(raw: RawTensor, path: str, *, dims: tuple[int, ...] | None = None,
                what: str = "initializer") -> tuple[TensorInfo, bool]:
    """(the tensor, whether its data type is unknown); ``dims`` overrides for a sparse tensor."""
    name = raw.name
    what = f"external {what}" if raw.data_location == 1 else what
    if raw.segment:
        raise MalformedCheckpoint(f"{what} {shown(name)} is segmented, which onnx cannot load")
    if raw.data_type == 0:
        raise MalformedCheckpoint(f"{what} {shown(name)} has no data type")
    shape = tuple(raw.dims) if dims is None else dims
    if len(shape) > MAX_RANK or any(d < 0 for d in (*shape, *raw.dims)):
        raise MalformedCheckpoint(f"{what} {shown(name)} has dims {list(shape)[:8]}, "
                                  f"not up to {MAX_RANK} non-negative sizes")
    numel = 1
    for dim in shape:
        numel *= dim
        if numel >= 2**63:
            raise MalformedCheckpoint(f"{what} {shown(name)}: dims {list(shape)[:8]} overflow")
    code = DATA_TYPES.get(raw.data_type)
    if code is None:
        return TensorInfo(name, f"onnx:{raw.data_type}", shape, path), True
    values = numel if dims is None else prod_of(raw.dims)
    nbytes = dtypes.nbytes(code, values)
    if raw.data_location == 1:
        location, start, length = _external(raw)
        if length is not None and nbytes is not None and length != nbytes:
            raise MalformedCheckpoint(f"{what} {shown(name)}: length {length:,} is not "
                                      f"the {nbytes:,} bytes of {code}{list(shape)}")
        end = start + (length if length is not None else nbytes or 0)
        file = posixpath.normpath(posixpath.join(posixpath.dirname(path), location))
        return TensorInfo(name, code, shape, file, start, end), False
    if raw.raw is not None:
        if code == "STRING":
            raise MalformedCheckpoint(f"{what} {shown(name)}: strings cannot be raw_data")
        size = raw.raw[1] - raw.raw[0]
        if size != nbytes:
            raise MalformedCheckpoint(f"{what} {shown(name)}: raw_data of {size:,} bytes is not "
                                      f"the {nbytes:,} bytes of {code}{list(shape)}")
        span: tuple[int, int] | tuple[None, None] = raw.raw if dims is None else (None, None)
        return TensorInfo(name, code, shape, path, *span), False
    number, per, elements = TYPED_FIELDS[code]
    want = -(-values * per // elements)
    if raw.counts.get(number, 0) != want:
        raise MalformedCheckpoint(f"{what} {shown(name)} holds {raw.counts.get(number, 0):,} values, "
                                  f"not the {want:,} of {code}{list(shape)}")
    return TensorInfo(name, code, shape, path), False


def read_tensor(wire: Wire, spans: Spans, depth: int) -> RawTensor:
    """A TensorProto's fields (a message sent in parts is merged), checked as protobuf parses them."""
    if depth > MAX_DEPTH:
        raise MalformedCheckpoint(f"protobuf messages nest more than {MAX_DEPTH} deep")
    t = RawTensor()
    known = SCHEMA["TensorProto"]
    for start, end in spans:
        for f in wire.fields(start, end, depth):
            kind = known.get(f.number)
            if f.number == 1:
                t.dims.extend(read_dims(wire, f, len(t.dims)))
            elif f.number == 2 and f.wire == VARINT:
                value = f.value & 0xFFFFFFFF
                t.data_type = value - (1 << 32) if value >= 1 << 31 else value
            elif f.number == 3 and f.wire == LEN:
                wire.validate("TensorProto.Segment", f.value, f.end, depth + 1)
                t.segment = True
            elif f.number in (4, 5, 7, 10, 11) and kind is not None:
                if f.wire == LEN:
                    t.counts[f.number] = t.counts.get(f.number, 0) + wire.packed_count(
                        kind.rstrip("*"), f.value, f.end)
                elif wire.number_kind(kind, f):
                    t.counts[f.number] = t.counts.get(f.number, 0) + 1
            elif f.number == 6 and f.wire == LEN:
                t.counts[6] = t.counts.get(6, 0) + 1
            elif f.number == 8 and f.wire == LEN:
                t.name = read_name(wire, f)
            elif f.number == 9 and f.wire == LEN:
                t.raw = (f.value, f.end)
            elif f.number == 13 and f.wire == LEN:
                t.external.append(_entry(wire, f, depth + 1))
            elif f.number == 14 and f.wire == VARINT:
                if f.value in (0, 1):  # a closed proto2 enum: other values are kept as unknown
                    t.data_location = f.value
            else:
                wire.validate_field(kind, f, depth)
    return t


def read_sparse(wire: Wire, spans: Spans, depth: int, path: str) -> tuple[RawTensor, tuple[int, ...]]:
    """A SparseTensorProto: its values tensor and dense dims; its indices are checked, not listed."""
    values: Spans = []
    indices: Spans = []
    dims: list[int] = []
    for start, end in spans:
        for g in wire.fields(start, end, depth):
            if g.number in (1, 2) and g.wire == LEN:
                (values if g.number == 1 else indices).append((g.value, g.end))
            elif g.number == 3:
                dims.extend(read_dims(wire, g, len(dims)))
    if not values or not indices:  # both are required, and to_array refuses an absent one
        raise MalformedCheckpoint(f"sparse tensor without {'values' if not values else 'indices'}")
    index = read_tensor(wire, indices, depth + 1)
    if tensor_info(index, path, what="sparse indices")[1]:
        raise MalformedCheckpoint(f"sparse indices of unknown data type {index.data_type}")
    return read_tensor(wire, values, depth + 1), tuple(dims)


def read_dims(wire: Wire, f: Field, have: int) -> list[int]:
    """Signed int64 values of a repeated varint field, packed or not; no more than one past MAX_RANK
    in all, which the shape check refuses (a packed field of 100 MB would be 100 M Python ints)."""
    if f.wire == VARINT:
        values = [f.value]
    elif f.wire == LEN:
        values, pos = [], f.value
        while pos < f.end and have + len(values) <= MAX_RANK:
            value, pos = wire.varint(pos, f.end)
            values.append(value)
    else:
        return []
    return [v - (1 << 64) if v >= 1 << 63 else v for v in values]


def read_name(wire: Wire, f: Field) -> str:
    if f.end - f.value > MAX_NAME:
        raise MalformedCheckpoint(f"a tensor name of {f.end - f.value:,} bytes (over {MAX_NAME:,})")
    return read_text(wire, f)


def read_text(wire: Wire, f: Field, limit: int | None = None) -> str:
    end = f.end if limit is None else min(f.end, f.value + limit)
    return wire.win.read(f.value, end - f.value).decode("utf-8", "backslashreplace")


def _entry(wire: Wire, f: Field, depth: int) -> tuple[str, str]:
    key = value = ""
    for g in wire.fields(f.value, f.end, depth):
        if g.number in (1, 2) and g.wire == LEN:
            text = read_text(wire, g, 4096)
            key, value = (text, value) if g.number == 1 else (key, text)
    return key, value


def prod_of(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _external(raw: RawTensor) -> tuple[str, int, int | None]:
    entries = dict(raw.external)  # later entries win, as ExternalDataInfo's setattr loop does
    location = entries.get("location", "")
    if not location:
        raise MalformedCheckpoint(f"external initializer {shown(raw.name)} names no location")
    parts = location.replace("\\", "/").split("/")
    if location.startswith(("/", "\\")) or _DRIVE.match(location) or ".." in parts:
        raise MalformedCheckpoint(f"external initializer {shown(raw.name)}: location {location[:200]!r} "
                                  "is not a path inside the model's folder")
    numbers = []
    for key in ("offset", "length"):
        text = entries.get(key)
        if text is not None and not (text.isascii() and text.isdigit()):
            raise MalformedCheckpoint(f"external initializer {shown(raw.name)}: {key} {text[:40]!r} "
                                      "is not a byte count")
        numbers.append(int(text) if text else None)
    return posixpath.normpath("/".join(parts)), numbers[0] or 0, numbers[1]


def external_data_findings(scan: FileScan, sizes: Mapping[str, int | None]) -> list[Finding]:
    """CG004 for each companion of an ONNX scan that is missing, or too short for its tensors.

    ``sizes`` maps each name in ``scan.companions`` to its size in bytes, or None
    where the file is missing (local or remote listing alike).
    """
    folder = posixpath.dirname(scan.path)
    by_file: dict[str, list[TensorInfo]] = {}
    for tensor in scan.tensors:
        if tensor.file != scan.path:
            by_file.setdefault(posixpath.relpath(tensor.file, folder or "."), []).append(tensor)
    findings = []
    for name in scan.companions:
        tensors = by_file.get(name, [])
        size = sizes.get(name)
        first = tensors[0].name if tensors else None
        if size is None:
            findings.append(make_finding(
                "CG004", scan.path, f"external data file {name!r} is missing; it holds {len(tensors):,} "
                f"initializer(s)" + (f", e.g. {shown(first)}" if first else ""), tensor=first))
            continue
        past = [t for t in tensors if (t.data_end or 0) > size]
        if past:
            worst = max(past, key=lambda t: t.data_end or 0)
            findings.append(make_finding(
                "CG004", scan.path, f"{len(past):,} initializer(s) run past the end of external data file "
                f"{name!r} ({size:,} bytes), e.g. {shown(worst.name)} to byte {worst.data_end:,}: truncated?",
                tensor=worst.name))
    return findings
