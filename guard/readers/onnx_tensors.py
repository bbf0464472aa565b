"""ONNX TensorProto fields -> TensorInfo, with ``numpy_helper.to_array``'s checks; external data.

An external tensor (``data_location`` 1) names a file beside the model in its
``external_data`` entries (``location``, ``offset``, ``length``).  Its TensorInfo
points at that file, so a value scan reads it there; the reader lists the file in
``FileScan.companions`` and ``external_data_findings`` checks, once the directory
listing is known, that each file exists and holds each tensor's range.  A location
that is absolute or climbs out of the model's folder is refused: ``onnx`` refuses
it too, and it would make a scan read files the model does not own.
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
from guard.readers.onnx_schema import DATA_TYPES, TYPED_FIELDS
from guard.tensors import FileScan, TensorInfo

MAX_RANK = 64  # numpy's limit: to_array cannot build more dims
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass
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


def tensor_info(raw: RawTensor, path: str, *, dims: tuple[int, ...] | None = None) -> tuple[TensorInfo, bool]:
    """(the tensor, whether its data type is unknown); ``dims`` overrides for a sparse tensor."""
    name = raw.name
    what = "external initializer" if raw.data_location == 1 else "initializer"
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
            raise MalformedCheckpoint(f"initializer {shown(name)}: strings cannot be raw_data")
        size = raw.raw[1] - raw.raw[0]
        if size != nbytes:
            raise MalformedCheckpoint(f"initializer {shown(name)}: raw_data of {size:,} bytes is not "
                                      f"the {nbytes:,} bytes of {code}{list(shape)}")
        start, end = raw.raw if dims is None else (None, None)
        return TensorInfo(name, code, shape, path, start, end), False
    number, per, elements = TYPED_FIELDS[code]
    want = -(-values * per // elements)
    if raw.counts.get(number, 0) != want:
        raise MalformedCheckpoint(f"initializer {shown(name)} holds {raw.counts.get(number, 0):,} values, "
                                  f"not the {want:,} of {code}{list(shape)}")
    return TensorInfo(name, code, shape, path), False


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
