"""GGUF (v2, v3): magic, version, key/value metadata and tensor infos; payloads are never read.

Layout (ggml ``docs/gguf.md``): ``GGUF``, u32 version, u64 tensor count, u64 kv
count; each kv is a string key, a u32 value type and the value (arrays: u32 element
type, u64 count, elements; strings: u64 length, bytes); each tensor info is a name,
u32 n_dims, u64 dims in ggml order (fastest-varying first), u32 ggml type and a u64
offset into the data section, which starts at the next multiple of
``general.alignment`` (default 32) after the infos.

The checks are llama.cpp's (``gguf.cpp``), where they find a broken file: at most 4
dims, rows a whole number of blocks, tensors that follow one another in the data
section at aligned offsets and end inside the file, no duplicate keys or names.
Counts are checked against the bytes left before anything is sized by them.  Files
written big-endian (the version's low half is zero when read little-endian) are
read as such, as gguf-py does; their byte ranges are not given out for value scans.
"""

from __future__ import annotations

import struct

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.readers.binary.window import Window
from guard.readers.gguf.types import FILE_TYPES, GGML_TYPES, REGISTRY, RETIRED
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20  # llama.cpp's bound: padding cannot be used to inflate allocations
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 8  # the spec allows arrays of arrays; nobody nests them deeper than 2
MAX_STRING = 16 * 2**20  # a key, tensor name or kept value; chat templates run to tens of KB
STRING, ARRAY = 8, 9
# value type -> struct code of the fixed-size scalars (7 is a one-byte bool)
SCALARS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
                           10: "Q", 11: "q", 12: "d"}
MIN_SIZE = {**{t: struct.calcsize(c) for t, c in SCALARS.items()}, STRING: 8, ARRAY: 12}
# keys whose values go into FileScan.metadata
KEPT = ("general.architecture", "general.name", "general.file_type", "general.quantization_version",
        "general.alignment", "split.no", "split.count", "split.tensors.count")


class _Parser:
    def __init__(self, window: Window, endian: str, pos: int) -> None:
        self.win = window
        self.endian = endian
        self.pos = pos

    def unpack(self, code: str, what: str) -> int | float | bool:
        size = struct.calcsize(code)
        at = self.win.need(self.pos, size, what)
        (value,) = struct.unpack_from(self.endian + code, self.win.data, at)
        self.pos += size
        return value

    def count(self, what: str, min_size: int) -> int:
        """A u64 count of items of at least ``min_size`` bytes each, checked against what is left."""
        value = int(self.unpack("Q", what))
        if value * min_size > self.win.size - self.pos:
            raise MalformedCheckpoint(f"{what} of {value:,} at offset {self.pos - 8:,} cannot fit in the file")
        return value

    def raw_string(self, what: str) -> bytes:
        length = self.count(f"{what} length", 1)
        if length > MAX_STRING:  # kept and read: a claimed 1 GB key is never read into memory
            raise MalformedCheckpoint(f"{what} of {length:,} bytes at offset {self.pos - 8:,} (over {MAX_STRING:,})")
        data = self.win.read(self.pos, length, what)
        self.pos += length
        return data

    def text(self, what: str) -> str:
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedCheckpoint(f"{what} at offset {self.pos - len(raw):,} is not UTF-8 "
                                      f"({exc.reason})") from None

    def value(self, vtype: int, *, keep: bool, depth: int = 0) -> object:
        """Read (``keep``) or skip one value of type ``vtype``."""
        if vtype in SCALARS:
            return self.unpack(SCALARS[vtype], "value")
        if vtype == STRING:
            if keep:
                return self.raw_string("string value").decode("utf-8", "replace")
            length = self.count("string length", 1)  # not `pos += count()`: count() moves pos itself
            self.pos += length
            return None
        if vtype != ARRAY:
            raise MalformedCheckpoint(f"unknown GGUF value type {vtype} at offset {self.pos - 4:,}")
        if depth >= MAX_ARRAY_DEPTH:
            raise MalformedCheckpoint(f"arrays nested more than {MAX_ARRAY_DEPTH} deep")
        itype = int(self.unpack("I", "array type"))
        if itype not in MIN_SIZE:
            raise MalformedCheckpoint(f"unknown GGUF array element type {itype} at offset {self.pos - 4:,}")
        n = self.count("array length", MIN_SIZE[itype])
        if itype in SCALARS:
            self.pos += n * MIN_SIZE[itype]
        elif itype == STRING:
            self._skip_strings(n)
        else:
            for _ in range(n):
                self.value(ARRAY, keep=False, depth=depth + 1)
        return None

    def _skip_strings(self, n: int) -> None:
        """Skip ``n`` length-prefixed strings (tokenizer vocabularies: 10^5 of them) in a tight loop."""
        fmt = struct.Struct(self.endian + "Q")
        while n:
            at = self.win.need(self.pos, 8, "string length")
            data, start = self.win.data, self.win.start
            limit = len(data) - 8
            while n and at <= limit:
                (length,) = fmt.unpack_from(data, at)
                if length > self.win.size - (start + at + 8):
                    raise MalformedCheckpoint(f"string length {length:,} at offset {start + at:,} "
                                              "runs past the end of the file")
                at += 8 + length
                n -= 1
            self.pos = start + at


def read_gguf(source: ByteSource) -> FileScan:
    win = Window(source)
    head = win.read(0, 24, "GGUF header")
    if head[:4] != MAGIC:
        raise MalformedCheckpoint("no GGUF magic")
    endian = "<"
    (version,) = struct.unpack_from("<I", head, 4)
    if version and not version & 0xFFFF:
        endian = ">"
        (version,) = struct.unpack_from(">I", head, 4)
    if version not in VERSIONS:
        raise MalformedCheckpoint(f"GGUF version {version} is not supported (v2 and v3 are)")
    parser = _Parser(win, endian, 8)
    tensor_count = parser.count("tensor count", 24)
    kv_count = parser.count("key/value count", 13)
    kept = _read_metadata(parser, kv_count)
    alignment = _alignment(kept)
    infos = [_tensor_info(parser) for _ in range(tensor_count)]
    data_start = -(-parser.pos // alignment) * alignment
    if tensor_count and data_start > source.size:
        raise MalformedCheckpoint(f"the data section would start at {data_start:,}, past the end of the file")
    tensors, findings = _place_tensors(source, infos, data_start, alignment, located=endian == "<")
    metadata = {**_metadata(kept, version, endian), "declared_tensors": str(tensor_count)}  # CG007 / CG001
    return FileScan(path=source.name, format="gguf", size=source.size, tensors=tuple(tensors),
                    findings=tuple(findings), metadata=metadata, bytes_read=win.bytes_read)


def _read_metadata(parser: _Parser, kv_count: int) -> dict[str, tuple[int, object]]:
    seen: set[str] = set()
    kept: dict[str, tuple[int, object]] = {}
    for _ in range(kv_count):
        key = parser.text("key")
        if key in seen:
            raise MalformedCheckpoint(f"duplicate key {shown(key)}")
        seen.add(key)
        vtype = int(parser.unpack("I", "value type"))
        value = parser.value(vtype, keep=key in KEPT)
        if key in KEPT:
            kept[key] = (vtype, value)
    return kept


def _alignment(kept: dict[str, tuple[int, object]]) -> int:
    if "general.alignment" not in kept:
        return DEFAULT_ALIGNMENT
    vtype, value = kept["general.alignment"]
    if vtype != 4 or not isinstance(value, int):
        raise MalformedCheckpoint("general.alignment is not a u32")
    if value == 0 or value & (value - 1) or value > MAX_ALIGNMENT:
        raise MalformedCheckpoint(f"general.alignment {value} is not a power of two up to {MAX_ALIGNMENT:,}")
    return value


def _tensor_info(parser: _Parser) -> tuple[str, tuple[int, ...], int, int]:
    name = parser.text("tensor name")
    n_dims = int(parser.unpack("I", "tensor n_dims"))
    if n_dims > MAX_DIMS:
        raise MalformedCheckpoint(f"tensor {shown(name)} has {n_dims:,} dims; ggml allows {MAX_DIMS}")
    dims = tuple(int(parser.unpack("Q", "tensor dims")) for _ in range(n_dims))
    numel = 1
    for dim in dims:
        numel *= dim
        if dim >= 2**63 or numel >= 2**63:
            raise MalformedCheckpoint(f"tensor {shown(name)}: dims {list(dims)} overflow a 64-bit count")
    ggml_type = int(parser.unpack("I", "tensor type"))
    offset = int(parser.unpack("Q", "tensor offset"))
    return name, dims, ggml_type, offset


def _place_tensors(source: ByteSource, infos: list[tuple[str, tuple[int, ...], int, int]], data_start: int,
                   alignment: int, *, located: bool) -> tuple[list[TensorInfo], list[Finding]]:
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    unknown: dict[int, list[str]] = {}
    expected = 0  # where the next tensor must start; after one of unknown size, anywhere past it
    exact = True
    for name, dims, ggml_type, offset in infos:
        if name in names:
            raise MalformedCheckpoint(f"duplicate tensor name {shown(name)}")
        names.add(name)
        code = GGML_TYPES.get(ggml_type)
        if ggml_type not in REGISTRY:  # no block size in ggml: llama.cpp refuses the file (CG009)
            unknown.setdefault(ggml_type, []).append(name)
        block = dtypes.ALL_DTYPES[code].block if code else None
        if block is not None and dims and dims[0] % block[0]:
            raise MalformedCheckpoint(f"tensor {shown(name)}: rows of {dims[0]:,} {code} elements are not "
                                      f"a whole number of {block[0]}-element blocks")
        nbytes = dtypes.nbytes(code, _numel(dims)) if code else None
        if offset % alignment or (offset != expected if exact else offset < expected):
            raise MalformedCheckpoint(
                f"tensor {shown(name)} has data offset {offset:,}" + (f", expected {expected:,}" if exact else "")
                + f" (tensors follow one another, {alignment}-byte aligned)")
        start = data_start + offset
        end = start + (nbytes or 0)
        if end > source.size:
            raise MalformedCheckpoint(f"tensor {shown(name)} ends at {end:,}, past the end of the file "
                                      f"({source.size:,} bytes): truncated?")
        exact = nbytes is not None
        expected = offset + -(-(nbytes or 0) // alignment) * alignment
        tensors.append(TensorInfo(name, code or f"ggml:{ggml_type}", tuple(reversed(dims)), source.name,
                                  start if located and exact else None, end if located and exact else None))
    findings = [_unreadable_type(source.name, ggml_type, names_) for ggml_type, names_ in unknown.items()]
    return tensors, findings


def _unreadable_type(file: str, ggml_type: int, names: list[str]) -> Finding:
    """CG009: tensors of a type id outside ggml's registry, or one it keeps with no block size."""
    if ggml_type in RETIRED:
        what = f"ggml type {ggml_type} ({RETIRED[ggml_type]}, removed from ggml: no block size)"
        if ggml_type == 4:
            what += "; ollama's gpt-oss blobs store MXFP4 experts under it, where ggml's MXFP4 is 39"
    else:
        what = f"ggml type {ggml_type}, outside ggml's registry (0-{max(REGISTRY)})"
    more = f" and {len(names) - 1:,} more" if len(names) > 1 else ""
    return make_finding("CG009", file, f"tensor {shown(names[0])}{more}: {what}; llama.cpp refuses the file "
                        "(no runtime that reads ggml's registry loads it)", tensor=names[0])


def _numel(dims: tuple[int, ...]) -> int:
    numel = 1
    for dim in dims:
        numel *= dim
    return numel


def _metadata(kept: dict[str, tuple[int, object]], version: int, endian: str) -> dict[str, str]:
    out = {"gguf.version": str(version)}
    if endian == ">":
        out["gguf.byteorder"] = "big"
    for key, (_vtype, value) in kept.items():
        if value is None:
            continue
        if key == "general.file_type" and isinstance(value, int):
            guessed = value & 1024 and value != 1024  # LLAMA_FTYPE_GUESSED is added to the real type
            base = value & ~1024 if guessed else value
            name = FILE_TYPES.get(base, f"UNKNOWN({base})")
            out[key] = name + (" (guessed)" if guessed else "")
        else:
            out[key] = str(value)
    return out
