from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from bounds import no_hang, traced
from safetensors import safe_open
from safetensors.torch import save_file

from guard.errors import MalformedCheckpoint
from guard.readers import scan_file
from guard.readers.safetensors import parse_header
from guard.sources import BytesSource, LocalFile
from guard.tensors import TensorInfo

DTYPES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64", torch.complex64: "C64",
}


def _tensors() -> dict[str, torch.Tensor]:
    out = {}
    for i, dtype in enumerate(DTYPES):
        base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        out[f"t{i}.{str(dtype)}"] = base.to(dtype) if dtype != torch.bool else base > 5
    out["scalar"] = torch.tensor(3.0)
    out["empty"] = torch.zeros(0, 5)
    return out


def _scan(path: Path):
    with LocalFile(path, name=path.name) as src:
        return scan_file(src)


def test_reads_exactly_what_safetensors_reports(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    tensors = _tensors()
    save_file(tensors, path, metadata={"format": "pt"})
    scan = _scan(path)
    assert scan.format == "safetensors" and not scan.findings
    assert scan.metadata == {"format": "pt"}
    ours = {t.name: (t.dtype, t.shape) for t in scan.tensors}
    with safe_open(path, framework="pt") as f:
        theirs = {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    assert ours == theirs
    raw = path.read_bytes()
    for t in scan.tensors:
        expected = tensors[t.name].contiguous().view(-1).view(torch.uint8).numpy().tobytes() \
            if tensors[t.name].numel() else b""
        assert raw[t.data_start : t.data_end] == expected, t.name
    assert scan.bytes_read < 2048


def _file(header: dict, data: bytes = b"", *, length: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (b"", "too short"),
        (b"\x05\x00", "too short"),
        (struct.pack("<Q", 2**40) + b"{}", "exceeds"),
        (struct.pack("<Q", 1000) + b"{}", "runs past"),
        (struct.pack("<Q", 2) + b"{not json", "not valid JSON"),
        (struct.pack("<Q", 9) + b"{not json", "not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "not UTF-8"),
        (_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4), "past the end"),
        (_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "needs 8 bytes"),
        (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 6), "overlaps"),
        (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "gap"),
        (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 9), "trailing"),
        (_file({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), "shape"),
        (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4), "data_offsets"),
        (_file({"a": [1, 2]}), "not an object"),
        (_file({"__metadata__": {"k": 1}}), "__metadata__"),
        (struct.pack("<Q", 4000) + b"[" * 2000 + b"]" * 2000, "nested"),
    ],
)
def test_malformed_headers_are_cg001_and_small(blob: bytes, reason: str) -> None:
    with traced() as peak, no_hang():
        scan = scan_file(BytesSource(blob, name="bad.safetensors"))
    assert [f.code for f in scan.findings] == ["CG001"]
    assert reason in scan.findings[0].message
    assert "\n" not in scan.findings[0].message
    assert peak.bytes < 8 * 2**20


def test_duplicate_keys_are_rejected() -> None:
    with pytest.raises(MalformedCheckpoint, match="duplicate"):
        parse_header(b'{"a": {}, "a": {}}')


def test_unknown_dtype_is_cg005_once_per_file(tmp_path: Path) -> None:
    header = {f"q{i}": {"dtype": "Q4_K", "shape": [4], "data_offsets": [i * 2, i * 2 + 2]} for i in range(3)}
    header["w"] = {"dtype": "F32", "shape": [1], "data_offsets": [6, 10]}
    scan = scan_file(BytesSource(_file(header, b"\0" * 10), name="q.safetensors"))
    assert [f.code for f in scan.findings] == ["CG005"]
    assert "Q4_K" in scan.findings[0].message and "3 tensor" in scan.findings[0].message
    assert {t.dtype for t in scan.tensors} == {"Q4_K", "F32"}


def test_sub_byte_dtypes_use_bit_sizes() -> None:
    header = {"f6": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]},
              "f4": {"dtype": "F4", "shape": [3, 4], "data_offsets": [3, 9]}}
    scan = scan_file(BytesSource(_file(header, b"\0" * 9), name="x.safetensors"))
    assert not scan.findings and [t.nbytes for t in scan.tensors] == [3, 6]


def _valid_file(tmp_path: Path) -> Path:
    path = tmp_path / "ok.safetensors"
    save_file({"a": torch.ones(16, 16), "b": torch.zeros(7, dtype=torch.bfloat16)}, path)
    return path


def test_truncation_verdicts_agree_with_reference(tmp_path: Path) -> None:
    raw = _valid_file(tmp_path).read_bytes()
    for cut in sorted({0, 3, 8, 9, 20, 60, len(raw) // 2, len(raw) - 1}):
        path = tmp_path / f"cut{cut}.safetensors"
        path.write_bytes(raw[:cut])
        ours_ok = not _scan(path).findings
        try:
            with safe_open(path, framework="pt") as f:
                for k in f.keys():
                    f.get_tensor(k)
            theirs_ok = True
        except Exception:  # the reference raises several types; only the verdict matters
            theirs_ok = False
        assert ours_ok == theirs_ok, cut
        assert not ours_ok


def test_lfs_pointer_is_cg002_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:" + "a" * 64 + "\nsize 548105171\n"
    )
    scan = _scan(path)
    assert [f.code for f in scan.findings] == ["CG002"]
    assert "lfs: true" in scan.findings[0].message and "548,105,171" in scan.findings[0].message


def test_garbage_is_cg001(tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(b"hello, this is not a checkpoint")
    assert [f.code for f in _scan(path).findings] == ["CG001"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": {}, "a": {}}',
        b'{"a:b": {}, "a:b": {}}',  # a colon in a name: the fast count cannot decide, the hooked parse does
        b'{"w": {"dtype": "F32", "dtype": "F16", "shape": [], "data_offsets": [0, 4]}}',
        b'{"__metadata__": {"k": "v", "k": "w"}}',
        b'{"w": {"x": {"y": 1, "y": 2}}}',  # deeper than the fast count looks
        b'{"a": {"b": 1, "b": 2}, "c": [',  # a duplicate before a syntax error is the duplicate
        b'[{"a": 1, "a": 2}]',
    ],
)
def test_duplicates_anywhere_are_rejected(raw: bytes) -> None:
    with pytest.raises(MalformedCheckpoint, match="duplicate"):
        parse_header(raw)


def test_fast_header_path_keeps_every_key() -> None:
    header = {"__metadata__": {"format": "pt", "note": "a:b"},
              "x:y": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    assert parse_header(json.dumps(header).encode()) == header


def test_records_match_the_tensorinfo_constructor(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"b": torch.ones(2, 3), "a": torch.zeros(4, dtype=torch.float16), "e": torch.zeros(0, 2)}, path)
    scan = _scan(path)
    assert not scan.findings
    for t in scan.tensors:
        assert type(t) is TensorInfo
        assert t == TensorInfo(t.name, t.dtype, t.shape, t.file, t.data_start, t.data_end)
        assert t.stride is None and t.storage is None and t.storage_offset is None


def test_offsets_out_of_header_order_still_tile() -> None:
    header = {"b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
              "z": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
              "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    scan = scan_file(BytesSource(_file(header, b"\0" * 8), name="x.safetensors"))
    assert not scan.findings and [t.name for t in scan.tensors] == ["b", "z", "a"]
    header["a"]["data_offsets"] = [0, 3]
    header["a"]["dtype"] = "U8"
    header["a"]["shape"] = [3]
    scan = scan_file(BytesSource(_file(header, b"\0" * 8), name="x.safetensors"))
    assert [f.code for f in scan.findings] == ["CG001"] and "gap" in scan.findings[0].message


# A header with no float, true or false in it is "plain": its entries are checked once per distinct
# (dtype, shape) pair. Whatever that shortcut sees, it refuses what the entry-by-entry checks refuse.
SHORTCUT_CASES = {
    "reversed offsets one byte apart, shape check failed": (
        {"a": {"dtype": "F32", "shape": [0], "data_offsets": [5, 4]}}, 5),
    "reversed offsets, unknown dtype": ({"a": {"dtype": "XX", "shape": [1], "data_offsets": [5, 4]}}, 5),
    "a dtype that is a list": ({"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, 4),
    "offsets as strings": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}}, 4),
    "a shape that is a string": ({"a": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}}, 4),
    "a shape of one float after the same shape in ints": (
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "b": {"dtype": "F32", "shape": [2.0], "data_offsets": [8, 16]}}, 16),
    "a shape of true after the same shape in ints": (
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
         "b": {"dtype": "F32", "shape": [True], "data_offsets": [4, 8]}}, 8),
}


@pytest.mark.parametrize("case", SHORTCUT_CASES)
def test_the_per_shape_shortcut_refuses_what_the_entry_checks_refuse(case: str) -> None:
    header, body = SHORTCUT_CASES[case]
    raw = json.dumps(header, separators=(",", ":")).encode()
    scan = scan_file(BytesSource(struct.pack("<Q", len(raw)) + raw + b"\0" * body, name="model.safetensors"))
    assert scan.format is None and [f.code for f in scan.findings] == ["CG001"], scan


def test_the_per_shape_shortcut_keeps_each_tensor_as_written() -> None:
    header = {"__metadata__": {"format": "pt"}, **{
        f"t{i}": {"dtype": ("BF16", "F32")[i % 2], "shape": [2, 3] if i % 3 else [6],
                  "data_offsets": [0, 0]} for i in range(9)}}
    offset = 0
    for entry in list(header.values())[1:]:
        size = 6 * (2 if entry["dtype"] == "BF16" else 4)
        entry["data_offsets"] = [offset, offset + size]
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    scan = scan_file(BytesSource(struct.pack("<Q", len(raw)) + raw + b"\0" * offset, name="model.safetensors"))
    assert not scan.findings
    assert [(t.name, t.dtype, t.shape, t.data_end - t.data_start) for t in scan.tensors] == [
        (name, e["dtype"], tuple(e["shape"]), e["data_offsets"][1] - e["data_offsets"][0])
        for name, e in list(header.items())[1:]]
