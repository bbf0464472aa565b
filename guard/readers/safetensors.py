"""safetensors: the 8-byte length, the JSON header, nothing else."""

from __future__ import annotations

import json
import struct
from math import prod

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

MAX_HEADER_SIZE = 100_000_000  # the reference (Rust) implementation's cap


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
        header = json.loads(text, object_pairs_hook=_no_duplicates)
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
        out[key] = value
    return out


def read_safetensors(source: ByteSource) -> FileScan:
    length, header = read_safetensors_header(source)
    metadata = _metadata(header.pop("__metadata__", None))
    buffer_start = 8 + length
    buffer_len = source.size - buffer_start
    tensors: list[TensorInfo] = []
    findings: list[Finding] = []
    unknown: dict[str, list[str]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        dtype, shape, begin, end = _entry(name, entry)
        size = dtypes.nbytes(dtype, prod(shape))
        if size is None:
            unknown.setdefault(dtype, []).append(name)
        elif end - begin != size:
            raise MalformedCheckpoint(
                f"tensor {name!r}: {dtype}{list(shape)} needs {size} bytes but spans {end - begin}"
            )
        spans.append((begin, end, name))
        tensors.append(TensorInfo(name, dtype, shape, source.name,
                                  buffer_start + begin, buffer_start + end))
    _check_layout(spans, buffer_len)
    for dtype, names in unknown.items():
        findings.append(make_finding(
            "CG005", source.name,
            f"unknown dtype {dtype!r} on {len(names)} tensor(s), e.g. {names[0]!r}",
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
    if not isinstance(entry, dict):
        raise MalformedCheckpoint(f"tensor {name!r}: entry is not an object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise MalformedCheckpoint(f"tensor {name!r}: missing or non-string dtype")
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise MalformedCheckpoint(f"tensor {name!r}: shape must be a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise MalformedCheckpoint(f"tensor {name!r}: data_offsets must be [begin, end] with begin <= end")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


def _check_layout(spans: list[tuple[int, int, str]], buffer_len: int) -> None:
    """Offsets must tile the data buffer exactly: contiguous, non-overlapping, fully covered."""
    expected = 0
    for begin, end, name in sorted(spans):
        if begin != expected:
            kind = "overlaps the previous tensor" if begin < expected else "leaves a gap before it"
            raise MalformedCheckpoint(f"invalid offset: tensor {name!r} {kind}")
        expected = end
    if expected != buffer_len:
        if expected > buffer_len:
            raise MalformedCheckpoint(
                f"tensor data runs past the end of the file ({expected:,} > {buffer_len:,} bytes): truncated?"
            )
        raise MalformedCheckpoint(f"file not fully covered: {buffer_len - expected:,} trailing bytes")
