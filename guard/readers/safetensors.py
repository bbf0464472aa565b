"""safetensors: the 8-byte length, the JSON header, nothing else."""

from __future__ import annotations

import json
import re
import struct

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

MAX_HEADER_SIZE = 100_000_000  # the reference (Rust) implementation's cap
_BITS = {code: info.bits for code, info in dtypes.DTYPES.items()}
_new_record = tuple.__new__  # TensorInfo's fields in order, half the cost of its Python __new__ (once per tensor)


def read_safetensors_header(source: ByteSource) -> tuple[int, dict[str, object]]:
    """Return (header length, parsed header) after the framing checks."""
    if source.size < 8:
        raise MalformedCheckpoint(f"file is {source.size} bytes, too short for a safetensors header")
    (length,) = struct.unpack("<Q", source.read_at(0, 8))
    if length > MAX_HEADER_SIZE:
        raise MalformedCheckpoint(f"header length {length:,} exceeds the {MAX_HEADER_SIZE:,}-byte limit")
    if 8 + length > source.size:
        raise MalformedCheckpoint(f"header length {length:,} runs past the end of the file")
    raw = source.read_at(8, length)
    return length, parse_header(raw)


def parse_header(raw: bytes) -> dict[str, object]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedCheckpoint(f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        if _needs_exact_parse(raw):
            # parse_constant/parse_int: the Rust reader (serde_json) refuses NaN and reads -0 as a float;
            # a \\u escape may decode to a lone surrogate, which no UTF-8 output could hold
            header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                                parse_int=_json_int)
        else:  # the common header: no escapes, no signs, no constants; only duplicates to refuse
            header = _parse_unique(raw, text)
    except json.JSONDecodeError as exc:
        raise MalformedCheckpoint(f"header is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(header, dict):
        raise MalformedCheckpoint("header is not a JSON object")
    return header


def _needs_exact_parse(raw: bytes) -> bool:
    """Whether the header holds what the fast parse cannot judge (a superset: names may trip it too)."""
    # one byte first (memchr, an order faster than a substring search): most headers have none of them
    return ((b"\\" in raw and b"\\u" in raw) or (b"N" in raw and b"NaN" in raw)
            or (b"I" in raw and b"Infinity" in raw) or (b"-" in raw and re.search(_SIGNED, raw) is not None))


_SIGNED = rb"-\s*[0-9]"  # a number with a sign (serde reads -0 as a float); compiled on first need, re caches it


def _parse_unique(raw: bytes, text: str) -> object:
    """json.loads at C speed, then proof that no object lost a key to a duplicate; else the hooked parse.

    A pairs hook costs a Python call and a list of pairs per object (40 % of the parse of a
    120-tensor header).  Instead: every key of every object is followed by a colon outside
    strings, so the colons in the text are at least the keys; the lengths of the objects
    counted below are at most the keys, and fewer where a duplicate collapsed.  Equal
    counts leave no room for a duplicate.  Anything else (colons in names, deeper
    objects, a header that is not an object, a failed parse whose error a duplicate
    before it would have changed) is judged by the hooked parse, exactly as before.
    """
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):
        pass
    else:
        if type(header) is dict and raw.count(b":") == len(header) + sum(
                [len(entry) for entry in header.values() if type(entry) is dict]):
            return header
    return json.loads(text, object_pairs_hook=_unique_keys)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise MalformedCheckpoint(f"duplicate key {duplicate!r} in header")
    return out


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


def _no_constant(name: str) -> object:
    raise MalformedCheckpoint(f"header holds {name}, which is not JSON")


def _json_int(text: str) -> int | float:
    return float(text) if text.startswith("-") else int(text)


def read_safetensors(source: ByteSource) -> FileScan:
    length, header = read_safetensors_header(source)
    metadata = _metadata(header.pop("__metadata__", None))
    buffer_start = 8 + length
    buffer_len = source.size - buffer_start
    file = source.name
    tensors: list[TensorInfo] = []
    findings: list[Finding] = []
    unknown: dict[str, list[str]] = {}
    tiled = 0  # where the next tensor must begin if the offsets tile the buffer in header order
    for name, entry in header.items():
        # The common entry is judged inline (a pre-commit hook pays this per tensor, 4,800 on a
        # pipeline's commit): a known dtype, dims >= 1, an exact span.  It passes exactly what
        # _entry and _span_size pass; anything else (an empty or unknown-dtype tensor, a bad
        # entry) goes through them, for their message or their CG005.
        try:
            dtype, dims, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            bits = _BITS[dtype]
        except (TypeError, KeyError, ValueError):
            bits = 0
        numel = 0
        if bits and type(dims) is list and type(begin) is int and type(end) is int and 0 <= begin <= end < _U64:
            numel = 1
            for dim in dims:
                if type(dim) is not int or dim < 1:
                    numel = 0
                    break
                numel *= dim  # dims >= 1: the product bounds every partial product (the overflow check)
        total = numel * bits
        if not (numel and total < _U64 and not total % 8 and end - begin == total >> 3):
            dtype, shape, begin, end = _entry(name, entry)
            size = _span_size(name, dtype, shape)
            if size is None:
                unknown.setdefault(dtype, []).append(name)
            elif end - begin != size:
                raise MalformedCheckpoint(
                    f"tensor {shown(name)}: {dtype}{list(shape)} needs {size} bytes but spans {end - begin}"
                )
        else:
            shape = tuple(dims)
        tiled = end if begin == tiled else -1
        # stride, storage, storage_offset: safetensors tensors are C-contiguous and share no storage
        tensors.append(_new_record(TensorInfo, (name, dtype, shape, file, buffer_start + begin, buffer_start + end,
                                                None, None, None)))
    if tiled != buffer_len:  # out of order, a gap, an overlap or a short buffer: the sorted walk says which
        _check_layout([(t.data_start - buffer_start, t.data_end - buffer_start, t.name) for t in tensors],
                      buffer_len)
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


def _metadata(value: object) -> dict[str, str]:
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
        if numel >= 2**64:
            raise MalformedCheckpoint(f"tensor {shown(name)}: shape {list(shape)[:8]} overflows a 64-bit size")
    if dtype not in dtypes.DTYPES:
        return None
    total = numel * dtypes.DTYPES[dtype].bits
    if total >= 2**64:
        raise MalformedCheckpoint(f"tensor {shown(name)}: {dtype}{list(shape)[:8]} overflows a 64-bit size")
    if total % 8:
        raise MalformedCheckpoint(f"tensor {shown(name)}: {dtype}{list(shape)} does not fill whole bytes")
    return total // 8


def _all_uints(values: list[object]) -> bool:
    """Every value a JSON integer in [0, 2^64) (``type is int``: never a bool or a float)."""
    for value in values:
        if type(value) is not int or not 0 <= value < _U64:  # type: ignore[operator]
            return False
    return True


_U64 = 2**64


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
