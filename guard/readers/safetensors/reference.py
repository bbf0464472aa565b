"""The reference reading of a safetensors file: the 8-byte length, the JSON header parsed, each entry checked.

Plain code, one entry at a time, with the Rust implementation's checks and messages.  Every header
the fast paths (``fast.read_fast``) decline comes here, and the fuzz differential holds them to it:
on any header, valid or not, they give what this gives (the same tensors, findings or one-line error).
"""

from __future__ import annotations

import struct

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

MAX_HEADER_SIZE = 100_000_000  # the reference (Rust) implementation's cap
U64 = 2**64


def framed(source: ByteSource) -> tuple[int, bytes]:
    """The header's length and bytes, after the framing checks."""
    if source.size < 8:
        raise MalformedCheckpoint(f"file is {source.size} bytes, too short for a safetensors header")
    (length,) = struct.unpack("<Q", source.read_at(0, 8))
    if length > MAX_HEADER_SIZE:
        raise MalformedCheckpoint(f"header length {length:,} exceeds the {MAX_HEADER_SIZE:,}-byte limit")
    if 8 + length > source.size:
        raise MalformedCheckpoint(f"header length {length:,} runs past the end of the file")
    return length, source.read_at(8, length)


def read_safetensors_header(source: ByteSource) -> tuple[int, dict[str, object]]:
    """Return (header length, parsed header) after the framing checks."""
    length, raw = framed(source)
    return length, parse_header(raw)


def parse_header(raw: bytes) -> dict[str, object]:
    """The header as the Rust reader (serde_json) accepts it: UTF-8, one JSON object, no duplicate key,
    no NaN or Infinity, no lone surrogate escape; a negative number reads as a float (as -0 does there)."""
    import json  # not at the top: the hook's headers never come here, and json's import is 2-4 % of its call

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedCheckpoint(f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=no_constant,
                            parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise MalformedCheckpoint(f"header is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(header, dict):
        raise MalformedCheckpoint("header is not a JSON object")
    return header


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise MalformedCheckpoint(f"duplicate key {key!r} in header")
        for text in (key, value) if isinstance(value, str) else (key,):
            # a lone surrogate (\ud800) decodes in Python but is not UTF-8: no output could encode it
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise MalformedCheckpoint("header holds a lone UTF-16 surrogate escape") from None
        out[key] = value
    return out


def unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """An object's pairs as a dict, refusing a duplicate key with the message ``_no_duplicates`` gives."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedCheckpoint(f"duplicate key {key!r} in header")
            seen.add(key)
    return out


def no_constant(name: str) -> object:
    raise MalformedCheckpoint(f"header holds {name}, which is not JSON")


def _json_int(text: str) -> int | float:
    return float(text) if text.startswith("-") else int(text)


def read_safetensors(source: ByteSource) -> FileScan:
    """The reference reading of a whole file (the fuzz differential's side of the comparison)."""
    length, raw = framed(source)
    return read_parsed(raw, source, length)


def read_parsed(raw: bytes, source: ByteSource, length: int) -> FileScan:
    """The scan of a header's bytes: each entry checked in order, the offsets' tiling, CG005 per unknown dtype."""
    header = parse_header(raw)
    metadata = check_metadata(header.pop("__metadata__", None))
    buffer_start = 8 + length
    buffer_len = source.size - buffer_start
    tensors: list[TensorInfo] = []
    spans: list[tuple[int, int, str]] = []
    unknown: dict[str, list[str]] = {}
    for name, entry in header.items():
        dtype, shape, begin, end = _entry(name, entry)
        size = _span_size(name, dtype, shape)
        if size is None:
            unknown.setdefault(dtype, []).append(name)
        elif end - begin != size:
            raise MalformedCheckpoint(
                f"tensor {shown(name)}: {dtype}{list(shape)} needs {size} bytes but spans {end - begin}")
        # stride, storage, storage_offset: safetensors tensors are C-contiguous and share no storage
        tensors.append(TensorInfo(name, dtype, shape, source.name, buffer_start + begin, buffer_start + end))
        spans.append((begin, end, name))
    _check_layout(spans, buffer_len)
    findings: list[Finding] = []
    for dtype, names in unknown.items():
        findings.append(make_finding(
            "CG005", source.name,
            f"unknown dtype {dtype!r} on {len(names)} tensor(s), e.g. {shown(names[0])}",
            tensor=names[0],
        ))
    return FileScan(
        path=source.name, format="safetensors", size=source.size,
        tensors=tuple(tensors), findings=tuple(findings), metadata=metadata,
        bytes_read=8 + length,
    )


def check_metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise MalformedCheckpoint("__metadata__ must map strings to strings")
    return value


def _entry(name: str, entry: object) -> tuple[str, tuple[int, ...], int, int]:
    if type(entry) is not dict:
        raise MalformedCheckpoint(f"tensor {shown(name)}: entry is not an object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if type(dtype) is not str:
        raise MalformedCheckpoint(f"tensor {shown(name)}: missing or non-string dtype")
    if type(shape) is not list or not _all_uints(shape):
        raise MalformedCheckpoint(f"tensor {shown(name)}: shape must be a list of non-negative integers")
    if type(offsets) is not list or len(offsets) != 2 or not _all_uints(offsets) or offsets[0] > offsets[1]:
        raise MalformedCheckpoint(f"tensor {shown(name)}: data_offsets must be [begin, end] with begin <= end")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _span_size(name: str, dtype: str, shape: tuple[int, ...]) -> int | None:
    """Bytes the tensor needs, with the reference's checks: no u64 overflow, whole bytes only."""
    numel = 1
    for dim in shape:  # stepwise, as Rust's checked_mul: also bounds the work on a hostile shape
        numel *= dim
        if numel >= U64:
            raise MalformedCheckpoint(f"tensor {shown(name)}: shape {list(shape)[:8]} overflows a 64-bit size")
    if dtype not in dtypes.DTYPES:
        return None
    total = numel * dtypes.DTYPES[dtype].bits
    if total >= U64:
        raise MalformedCheckpoint(f"tensor {shown(name)}: {dtype}{list(shape)[:8]} overflows a 64-bit size")
    if total % 8:
        raise MalformedCheckpoint(f"tensor {shown(name)}: {dtype}{list(shape)} does not fill whole bytes")
    return total // 8


def _all_uints(values: list[object]) -> bool:
    """Every value a JSON integer in [0, 2^64) (``type is int``: never a bool or a float)."""
    for value in values:
        if type(value) is not int or not 0 <= value < U64:
            return False
    return True


def _check_layout(spans: list[tuple[int, int, str]], buffer_len: int) -> None:
    """Offsets must tile the data buffer exactly: contiguous, non-overlapping, fully covered."""
    expected = 0
    for begin, end, name in sorted(spans):
        if begin != expected:
            kind = "overlaps the previous tensor" if begin < expected else "leaves a gap before it"
            raise MalformedCheckpoint(f"invalid offset: tensor {shown(name)} {kind}")
        expected = end
    if expected != buffer_len:
        if expected > buffer_len:
            raise MalformedCheckpoint(
                f"tensor data runs past the end of the file ({expected:,} > {buffer_len:,} bytes): truncated?"
            )
        raise MalformedCheckpoint(f"file not fully covered: {buffer_len - expected:,} trailing bytes")
