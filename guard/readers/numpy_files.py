"""NumPy ``.npy`` (format versions 1-3) and ``.npz`` (a zip of ``.npy`` members): headers only.

An ``.npy`` file is ``\\x93NUMPY``, major, minor, a u16 (v1) or u32 (v2, v3)
header length, then a Python dict literal ``{'descr', 'fortran_order', 'shape'}``
(latin-1; UTF-8 in v3) and the array bytes.  The literal is evaluated by
``ast.literal_eval`` on at most numpy's own 10,000 characters, with numpy's checks.

An ``.npz`` is read through its central directory, every entry its declared size holds
(as zipfile reads it, whatever count the end record gives): for each member, its local
header and then only the first bytes of its data, inflated up to the end of the
``.npy`` header for a deflated member (``savez_compressed``).  A member's declared
size must be its header plus the array's bytes, so a member cannot claim more
than it holds.

``descr`` maps to a dtype code.  Extension dtypes lose their identity in an
``.npy``: ml_dtypes' bfloat16 and float8 types are saved as ``<V2`` / ``|V1``
(opaque bytes).  They are reported as ``V2`` / ``V1`` with CG005 that says so,
never guessed as bf16.  Object arrays (``|O``) hold a pickle: CG003, not read.
"""

from __future__ import annotations

import ast
import io
import posixpath
import re
import struct
import tokenize

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.readers.binary.zipdir import MemberPrefix, ZipEntry, open_member, read_zipfile_archive
from guard.sources import ByteSource, BytesSource
from guard.tensors import FileScan, TensorInfo

MAGIC = b"\x93NUMPY"
MAX_HEADER = 10_000  # numpy's _MAX_HEADER_SIZE: a longer header is refused unless pickles are allowed
_LENGTH = {1: "<H", 2: "<I", 3: "<I"}
_KINDS = {"f": "F", "i": "I", "u": "U", "c": "C"}
_CODES = {"F2": "F16", "F4": "F32", "F8": "F64", "I1": "I8", "I2": "I16", "I4": "I32", "I8": "I64",
          "U1": "U8", "U2": "U16", "U4": "U32", "U8": "U64", "C8": "C64", "C16": "C128", "B1": "BOOL"}
# numpy's one-letter type codes for the same dtypes ('<f' is float32, '?' bool, ...)
_LETTERS = {"e": "F16", "f": "F32", "d": "F64", "b": "I8", "h": "I16", "i": "I32", "q": "I64", "l": "I64",
            "B": "U8", "H": "U16", "I": "U32", "Q": "U64", "L": "U64", "F": "C64", "D": "C128", "?": "BOOL"}
_DESCR = re.compile(r"([<>|=]?)([a-zA-Z?])(\d*)(\[\w+\])?")
_PY2_LONG = re.compile(r"[0-9]\s*L")


class NpyHeader:
    __slots__ = ("code", "shape", "fortran", "big_endian", "itemsize", "header_end", "note")

    def __init__(self, code: str, shape: tuple[int, ...], fortran: bool, big_endian: bool,
                 itemsize: int | None, header_end: int, note: str | None) -> None:
        self.code, self.shape, self.fortran, self.big_endian = code, shape, fortran, big_endian
        self.itemsize, self.header_end, self.note = itemsize, header_end, note

    @property
    def nbytes(self) -> int | None:
        if self.itemsize is None:
            return None
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * self.itemsize


def header_length(prefix: bytes) -> tuple[int, int]:
    """(bytes before the dict literal, literal length) from the first 12 bytes of a ``.npy``."""
    if not prefix.startswith(MAGIC) or len(prefix) < 10:
        raise MalformedCheckpoint("no .npy magic")
    major, minor = prefix[6], prefix[7]
    if major not in _LENGTH or minor != 0:
        raise MalformedCheckpoint(f".npy format version {major}.{minor} is not 1.0, 2.0 or 3.0")
    fmt = _LENGTH[major]
    start = 8 + struct.calcsize(fmt)
    if len(prefix) < start:
        raise MalformedCheckpoint(".npy header is truncated")
    (length,) = struct.unpack_from(fmt, prefix, 8)
    return start, length


def parse_npy_header(raw: bytes, *, version: int, start: int) -> NpyHeader:
    """The dict literal ``raw`` (its bytes), checked as numpy checks it."""
    text = raw.decode("utf-8" if version == 3 else "latin-1")
    if len(text) > MAX_HEADER:
        raise MalformedCheckpoint(f".npy header of {len(text):,} characters is over numpy's {MAX_HEADER:,}")
    try:
        header = _literal(text, python2=version < 3)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError, tokenize.TokenError):
        raise MalformedCheckpoint(".npy header is not a Python literal") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise MalformedCheckpoint(".npy header is not a dict of descr, fortran_order and shape")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise MalformedCheckpoint(f".npy shape {str(shape)[:80]} is not a tuple of non-negative integers")
    if not isinstance(fortran, bool):
        raise MalformedCheckpoint(".npy fortran_order is not a bool")
    code, itemsize, big, note = _descr(header["descr"])
    return NpyHeader(code, tuple(int(d) for d in shape), fortran, big, itemsize, start + len(raw), note)


def _literal(text: str, *, python2: bool) -> object:
    """``ast.literal_eval``; for format 1.0/2.0 headers, numpy's second try with Python 2's ``3L`` ints."""
    try:
        return ast.literal_eval(text)
    except SyntaxError:
        if not python2 or not _PY2_LONG.search(text):  # the filter only drops an "L" after a number
            raise
    tokens, after_number = [], False
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if not (after_number and token.type == tokenize.NAME and token.string == "L"):
            tokens.append(token)
        after_number = token.type == tokenize.NUMBER
    return ast.literal_eval(tokenize.untokenize(tokens))


def _descr(descr: object) -> tuple[str, int | None, bool, str | None]:
    """(code, itemsize or None, big-endian, why CG005 or CG003) for a descr."""
    if not isinstance(descr, str):  # a structured or sub-array dtype: numpy reads it, we do not size it
        if isinstance(descr, (list, tuple)) and descr:
            return "structured", None, False, "a structured (record) dtype"
        raise MalformedCheckpoint(".npy descr is not a dtype descriptor")
    match = _DESCR.fullmatch(descr)
    if match is None:
        raise MalformedCheckpoint(f".npy descr {descr[:40]!r} is not a dtype numpy knows")
    order, kind, digits, unit = match.groups()
    big = order == ">"
    if kind == "O" and not digits and not unit:
        return "object", None, False, "object"
    if kind in "VSU" and digits and not unit:
        width = int(digits) * (4 if kind == "U" else 1)
        if kind == "V":
            note = (f"opaque {digits}-byte elements ({descr!r}): ml_dtypes types such as bfloat16 and "
                    "float8 lose their dtype in an .npy and load as raw bytes")
        else:
            note = f"a {'byte' if kind == 'S' else 'unicode'} string dtype ({descr!r})"
        return f"{kind}{digits}", width, big, note
    if kind in "Mm" and digits == "8":
        return ("datetime64" if kind == "M" else "timedelta64"), 8, big, f"a time dtype ({descr!r})"
    if unit:
        raise MalformedCheckpoint(f".npy descr {descr[:40]!r} is not a dtype numpy knows")
    code: str | None
    if not digits and kind in _LETTERS:
        code = _LETTERS[kind]
    elif kind in _KINDS or kind == "b":
        code = _CODES.get(f"{_KINDS.get(kind, 'B')}{digits}") if digits else None
        if code is None and kind in "fc" and digits in ("16", "32"):  # long double: platform-defined
            return f"{'float' if kind == 'f' else 'complex'}{int(digits) * 8}", int(digits), big, \
                f"extended precision ({descr!r})"
    else:
        code = None
    if code is None:
        raise MalformedCheckpoint(f".npy descr {descr[:40]!r} is not a dtype numpy knows")
    itemsize = (dtypes.ALL_DTYPES[code].bits + 7) // 8
    return code, itemsize, big and itemsize > 1, None


def read_npy_header(source: ByteSource, at: int = 0, limit: int | None = None) -> NpyHeader:
    limit = source.size if limit is None else limit
    prefix = source.read_at(at, min(12, limit - at))
    start, length = header_length(prefix)
    if at + start + length > limit:
        raise MalformedCheckpoint(f".npy header of {length:,} bytes runs past the end of the data")
    if length > 4 * MAX_HEADER:
        raise MalformedCheckpoint(f".npy header of {length:,} bytes is over numpy's {MAX_HEADER:,}")
    return parse_npy_header(source.read_at(at + start, length), version=prefix[6], start=start)


def read_npy(source: ByteSource) -> FileScan:
    header = read_npy_header(source)
    name = posixpath.basename(source.name)
    name = name[:-4] if name.lower().endswith(".npy") else name
    end = header.header_end + (header.nbytes or 0)
    if end > source.size:
        raise MalformedCheckpoint(f"array data ends at {end:,}, past the end of the file "
                                  f"({source.size:,} bytes): truncated?")
    tensors, findings = _array(source.name, name, header, header.header_end)
    return FileScan(path=source.name, format="npy", size=source.size, tensors=tensors,
                    findings=findings, bytes_read=header.header_end)


def _array(path: str, name: str, header: NpyHeader, data_at: int | None
           ) -> tuple[tuple[TensorInfo, ...], tuple[Finding, ...]]:
    """The member or file as a TensorInfo (none for an object array), and its CG003/CG005."""
    if header.code == "object":
        return (), (make_finding(
            "CG003", path, f"array {shown(name)} has dtype object: its bytes are a pickle, which numpy "
            "loads only with allow_pickle=True (it was not read)", tensor=name),)
    findings: tuple[Finding, ...] = ()
    if header.note is not None:
        findings = (make_finding("CG005", path, f"array {shown(name)} has {header.note}", tensor=name),)
    located = data_at is not None and not header.big_endian and header.nbytes is not None
    start = data_at if located else None
    end = data_at + header.nbytes if located and data_at is not None and header.nbytes is not None else None
    stride = None
    if header.fortran and len(header.shape) > 1:
        steps, acc = [], 1
        for dim in header.shape:
            steps.append(acc)
            acc *= dim
        stride = tuple(steps)
    return (TensorInfo(name, header.code, header.shape, path, start, end, stride),), findings


def read_npz(source: ByteSource) -> FileScan:
    archive = read_zipfile_archive(source)  # numpy opens it with zipfile
    ordered = sorted(archive.entries.values(), key=lambda e: e.header_offset)
    limits = {e.name: nxt.header_offset for e, nxt in zip(ordered, ordered[1:])}
    tensors: list[TensorInfo] = []
    findings: list[Finding] = []
    compressed = False
    for entry in archive.entries.values():
        limit = limits.get(entry.name, archive.directory_offset)
        data_at = _member_data(source, entry, limit)  # zipfile's checks on opening any member
        if not entry.name.endswith(".npy"):
            continue  # numpy.load returns such members as raw bytes; savez never writes them
        compressed |= entry.method == 8
        header = _member_header(source, entry, data_at)
        needed = header.header_end + (header.nbytes or 0)
        if entry.size < needed:
            raise MalformedCheckpoint(f"member {entry.name!r} holds {entry.size:,} bytes, "
                                      f"less than its array's {needed:,}")
        located = data_at + header.header_end if entry.method == 0 else None
        member_tensors, member_findings = _array(source.name, entry.name[:-4], header, located)
        tensors.extend(member_tensors)
        findings.extend(member_findings)
    return FileScan(path=source.name, format="npz", size=source.size, tensors=tuple(tensors),
                    findings=tuple(findings), metadata={"npz.compressed": str(compressed).lower()},
                    bytes_read=getattr(source, "bytes_read", 0))


def _member_data(source: ByteSource, entry: ZipEntry, limit: int) -> int:
    """Where a member's bytes start, after the checks zipfile makes when it opens the member."""
    if entry.version_needed & 0xFF > 63:  # zipfile's MAX_EXTRACT_VERSION (the low byte; the high one is an OS)
        raise MalformedCheckpoint(f"member {entry.name!r} needs zip version {(entry.version_needed & 0xFF) / 10} "
                                  "to extract")
    return open_member(source, entry, end=limit, zipfile_checks=True)


def _member_header(source: ByteSource, entry: ZipEntry, data_at: int) -> NpyHeader:
    """The member's .npy header; of a deflated member, only the bytes up to its end are inflated."""
    if entry.method == 0:
        return read_npy_header(source, data_at, data_at + entry.compressed_size)
    member = MemberPrefix(source, entry, data_at)
    prefix = member.read(12)
    if len(prefix) == 12:
        start, length = header_length(prefix)
        want = start + min(length, 4 * MAX_HEADER + 1)
        prefix = member.read(want)
        if len(prefix) == want:
            return read_npy_header(BytesSource(prefix), 0)
    raise MalformedCheckpoint(f"member {entry.name!r} ends inside its .npy header")
