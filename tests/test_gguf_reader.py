"""GGUF reader: files written by gguf's GGUFWriter read back as gguf.GGUFReader reads them; hostile headers.

Valid files come from the real writer (F32, F16, BF16, I32, F64 and Q8_0/Q4_0/TQ2_0/MXFP4
blocks quantized by gguf.quants; big-endian; split keys).  Malformed ones are
hand-made bytes: each is CG001 (or CG009 for a ggml type llama.cpp cannot read) in well under
a second, within a few MB, never an exception.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fuzz_inputs import assert_refused, assert_well_behaved, bounded_scan

from guard.readers import scan_file
from guard.sources import LocalFile

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")
ml_dtypes = pytest.importorskip("ml_dtypes")
from fuzz_formats_a import write_gguf  # noqa: E402
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader  # noqa: E402
from gguf.quants import quantize  # noqa: E402


def add_quantized(writer: Any, name: str, array: Any, qtype: Any) -> None:
    q = quantize(array, qtype)
    writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)


def llama_like(writer: Any, *, file_type: int = 7) -> None:
    rng = np.random.default_rng(0)
    writer.add_file_type(file_type)
    writer.add_quantization_version(2)
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)])
    writer.add_array("tokenizer.ggml.token_type", [1] * 300)
    writer.add_array("nested", [[1, 2], [3]])
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("general.flag", True)
    add_quantized(writer, "blk.0.ffn_up.weight", rng.standard_normal((4, 256)).astype(np.float32),
                  GGMLQuantizationType.Q8_0)
    add_quantized(writer, "blk.0.ffn_down.weight", rng.standard_normal((2, 256)).astype(np.float32),
                  GGMLQuantizationType.Q4_0)
    add_quantized(writer, "blk.0.attn_q.weight", rng.standard_normal((2, 256)).astype(np.float32),
                  GGMLQuantizationType.TQ2_0)
    add_quantized(writer, "blk.0.attn_k.weight", rng.standard_normal((1, 64)).astype(np.float32),
                  GGMLQuantizationType.MXFP4)
    writer.add_tensor("token_embd.weight", rng.standard_normal((8, 32)).astype(np.float16))
    bf = rng.standard_normal((3, 32)).astype(ml_dtypes.bfloat16).view(np.uint8)
    writer.add_tensor("output.weight", bf, raw_dtype=GGMLQuantizationType.BF16, raw_shape=bf.shape)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(32, np.float32))
    writer.add_tensor("rope_freqs", np.zeros(4, np.float64))
    writer.add_tensor("positions", np.arange(6, dtype=np.int32))


def reference(path: Path) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    reader = GGUFReader(path)
    return {t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())), t.data_offset,
                     t.n_bytes) for t in reader.tensors}


def ours(path: Path) -> Any:
    with LocalFile(path, name=path.name) as source:
        return scan_file(source)


@pytest.mark.slow
@pytest.mark.parametrize("endian", [GGUFEndian.LITTLE, GGUFEndian.BIG], ids=["little", "big"])
def test_reads_back_what_gguf_reader_reports(tmp_path: Path, endian: Any) -> None:
    path = write_gguf(tmp_path / "model-q8_0.gguf", llama_like, endianess=endian)
    scan = ours(path)
    assert scan.format == "gguf" and scan.findings == ()
    theirs = reference(path)
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == {k: v[:2] for k, v in theirs.items()}
    assert {t.name: t.nbytes for t in scan.tensors} == {k: v[3] for k, v in theirs.items()}
    if endian == GGUFEndian.LITTLE:  # byte ranges are given out only for little-endian data
        assert {t.name: t.data_start for t in scan.tensors} == {k: v[2] for k, v in theirs.items()}
        assert all(t.data_end - t.data_start == t.nbytes for t in scan.tensors)
    else:
        assert scan.metadata["gguf.byteorder"] == "big" and all(t.data_start is None for t in scan.tensors)
    assert scan.metadata["general.architecture"] == "llama"
    assert scan.metadata["general.file_type"] == "MOSTLY_Q8_0"
    assert scan.metadata["general.quantization_version"] == "2"
    assert scan.metadata["gguf.version"] == "3"


@pytest.mark.slow
def test_alignment_split_keys_and_block_sizes(tmp_path: Path) -> None:
    def build(w: Any) -> None:
        w.add_custom_alignment(64)
        w.add_uint16("split.no", 1)
        w.add_uint16("split.count", 3)
        w.add_int32("split.tensors.count", 7)
        add_quantized(w, "w", np.ones((3, 512), np.float32), GGMLQuantizationType.Q8_0)
        w.add_tensor("b", np.ones(5, np.float32))

    path = write_gguf(tmp_path / "model-00002-of-00003.gguf", build)
    scan = ours(path)
    assert scan.findings == ()
    assert {k: scan.metadata[k] for k in ("general.alignment", "split.no", "split.count",
                                          "split.tensors.count")} == {
        "general.alignment": "64", "split.no": "1", "split.count": "3", "split.tensors.count": "7"}
    w = next(t for t in scan.tensors if t.name == "w")
    assert w.dtype == "Q8_0" and w.shape == (3, 512) and w.nbytes == 3 * 16 * 34  # 16 blocks of 34 bytes
    assert all(t.data_start % 64 == 0 for t in scan.tensors)
    assert {t.name: t.data_start for t in scan.tensors} == {k: v[2] for k, v in reference(path).items()}


def test_a_header_under_1_mib_costs_at_most_two_reads(tmp_path: Path) -> None:
    def build(w: Any) -> None:
        w.add_array("tokenizer.ggml.tokens", [f"token-{i:06d}" for i in range(40_000)])  # ~800 KiB
        w.add_tensor("w", np.ones((4, 4), np.float32))

    path = write_gguf(tmp_path / "vocab.gguf", build)
    with LocalFile(path) as source:
        scan = scan_file(source)
        reads = source.reads
    assert scan.findings == () and len(scan.tensors) == 1
    assert 600_000 < path.stat().st_size < 1_000_000
    assert reads <= 3  # the dispatcher's 512-byte sniff, then the header in two reads


# ---------------------------------------------------------------- hostile headers (hand-made)

def _str(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _kv(key: bytes, vtype: int, value: bytes) -> bytes:
    return _str(key) + struct.pack("<I", vtype) + value


def _tensor(name: bytes, dims: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    return _str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + \
        struct.pack("<IQ", ggml_type, offset)


def _file(kvs: list[bytes], tensors: list[bytes], data: bytes = b"", *, version: int = 3,
          counts: tuple[int, int] | None = None) -> bytes:
    n_t, n_kv = counts if counts is not None else (len(tensors), len(kvs))
    head = b"GGUF" + struct.pack("<IQQ", version, n_t, n_kv) + b"".join(kvs) + b"".join(tensors)
    return head + b"\0" * (-len(head) % 32) + data


def _nested(depth: int) -> bytes:
    value = struct.pack("<IQ", 0, 0)  # innermost: an empty u8 array
    for _ in range(depth - 1):
        value = struct.pack("<IQ", 9, 1) + value
    return value


HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "tensor-count-2^63": (lambda: _file([], [], counts=(2**63, 0)), "tensor count"),
    "kv-count-2^63": (lambda: _file([], [], counts=(0, 2**63)), "key/value count"),
    "u8-array-of-10^9": (lambda: _file([_kv(b"a", 9, struct.pack("<IQ", 0, 10**9))], []), "array length"),
    "string-array-of-2^40": (lambda: _file([_kv(b"a", 9, struct.pack("<IQ", 8, 2**40))], []), "array length"),
    "arrays-nested-10000-deep": (lambda: _file([_kv(b"a", 9, _nested(10_000))], []), "nested"),
    "string-of-2^62-bytes": (lambda: _file([_kv(b"a", 8, struct.pack("<Q", 2**62))], []), "string length"),
    "key-of-2^64-1-bytes": (lambda: b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**64 - 1) + b"\0" * 64,
                            "key length"),
    "dims-overflow": (lambda: _file([], [_tensor(b"t", (2**40, 2**40))]), "overflow"),
    "dims-2^32-1": (lambda: b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + _str(b"t") + struct.pack("<I", 2**32 - 1)
                    + b"\0" * 64, "dims"),
    "unknown-value-type": (lambda: _file([_kv(b"a", 13, b"\0" * 8)], []), "value type"),
    "version-1": (lambda: _file([], [], version=1), "version"),
    "version-4": (lambda: _file([], [], version=4), "version"),
    "alignment-3": (lambda: _file([_kv(b"general.alignment", 4, struct.pack("<I", 3))], []), "power of two"),
    "alignment-2^30": (lambda: _file([_kv(b"general.alignment", 4, struct.pack("<I", 2**30))], []),
                       "power of two"),
    "alignment-not-u32": (lambda: _file([_kv(b"general.alignment", 10, struct.pack("<Q", 64))], []), "u32"),
    "duplicate-key": (lambda: _file([_kv(b"a", 0, b"\1"), _kv(b"a", 0, b"\2")], []), "duplicate"),
    "duplicate-tensor": (lambda: _file([], [_tensor(b"t", (1,)), _tensor(b"t", (1,), offset=32)],
                                       b"\0" * 64), "duplicate"),
    "data-past-the-end": (lambda: _file([], [_tensor(b"t", (1024,))], b"\0" * 16), "past the end"),
    "offset-not-aligned": (lambda: _file([], [_tensor(b"t", (4,), offset=4)], b"\0" * 64), "offset"),
    "overlapping-tensors": (lambda: _file([], [_tensor(b"a", (8,)), _tensor(b"b", (8,), offset=0)],
                                          b"\0" * 64), "offset"),
    "row-not-whole-blocks": (lambda: _file([], [_tensor(b"q", (33,), 8)], b"\0" * 64), "blocks"),
    "five-dims": (lambda: _file([], [_tensor(b"t", (1, 1, 1, 1, 1))], b"\0" * 32), "dims"),
    "key-not-utf8": (lambda: _file([_kv(b"\xff\xfe", 0, b"\1")], []), "UTF-8"),
    "truncated-in-counts": (lambda: b"GGUF\x03\0\0\0\x01\0", "past the end"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_headers_are_cg001_fast_and_small(case: str) -> None:
    build, contains = HOSTILE[case]
    assert_refused(build(), "model.gguf", contains)


def test_a_type_outside_ggmls_registry_is_cg009_not_a_crash() -> None:
    data = _file([], [_tensor(b"t", (4,), ggml_type=99), _tensor(b"u", (4,), offset=32)], b"\0" * 64)
    result = bounded_scan(data, "model.gguf")
    assert_well_behaved(result, data)
    assert [(f.code, f.severity.value) for f in result.scan.findings] == [("CG009", "error")]
    assert "tensor 't': ggml type 99, outside ggml's registry" in result.scan.findings[0].message
    assert [(t.name, t.dtype) for t in result.scan.tensors] == [("t", "ggml:99"), ("u", "F32")]


def test_the_readers_table_is_the_gguf_packages_registry() -> None:
    """Every id ggml reads (gguf's GGMLQuantizationType) with its block (GGML_QUANT_SIZES: elements, bytes); the
    ids the reader keeps beyond it are the retired ones, which CG009 reports."""
    from gguf.constants import GGML_QUANT_SIZES

    from guard import dtypes
    from guard.readers.gguf.types import GGML_TYPES, REGISTRY, RETIRED

    assert REGISTRY == {int(t.value): t.name for t in GGMLQuantizationType}
    for t in GGMLQuantizationType:
        elements, nbytes = GGML_QUANT_SIZES[t]
        assert dtypes.nbytes(REGISTRY[int(t.value)], elements) == nbytes, t.name
    assert set(GGML_TYPES) - set(REGISTRY) <= set(RETIRED)
    assert not set(RETIRED) & {int(t.value) for t in GGMLQuantizationType}


def _mxfp4_experts(writer: Any) -> None:
    """gpt-oss's layout in miniature: MXFP4 experts quantized by gguf.quants, the rest F32."""
    rng = np.random.default_rng(1)
    add_quantized(writer, "blk.0.ffn_gate_exps.weight", rng.standard_normal((4, 64)).astype(np.float32),
                  GGMLQuantizationType.MXFP4)
    add_quantized(writer, "blk.0.ffn_down_exps.weight", rng.standard_normal((4, 64)).astype(np.float32),
                  GGMLQuantizationType.MXFP4)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))


def _retype(data: bytes, name: bytes, ggml_type: int) -> bytes:
    """The tensor's type id in its tensor info (name, n_dims u32, dims u64 each, type u32) set to ``ggml_type``,
    as ollama's blobs carry MXFP4 experts."""
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    at += 4 + 8 * n_dims
    return data[:at] + struct.pack("<I", ggml_type) + data[at + 4:]


def test_a_healthy_mxfp4_file_is_read_with_its_block_size(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "gpt-oss-mxfp4.gguf", _mxfp4_experts)
    scan = ours(path)
    assert scan.findings == ()
    gate = next(t for t in scan.tensors if t.name == "blk.0.ffn_gate_exps.weight")
    assert gate.dtype == "MXFP4" and gate.shape == (4, 64)  # the logical size: 256 elements
    assert gate.nbytes == 4 * 2 * 17  # 2 blocks of 32 elements in 17 bytes per row
    assert {t.name: t.data_start for t in scan.tensors} == {k: v[2] for k, v in reference(path).items()}
    import json

    from guard.cli import main

    assert main(["scan", "--format", "json", "--no-summary", "-o", str(tmp_path / "r.json"), str(path)]) == 0
    [model] = json.loads((tmp_path / "r.json").read_text())["models"]
    assert (model["parameters"], model["bytes"]) == (2 * 256 + 64, 2 * 136 + 256)  # logical elements; MXFP4's bytes


@pytest.mark.parametrize("ggml_type, words", [(4, "ggml type 4 (Q4_2, removed from ggml: no block size); ollama's"),
                                              (31, "ggml type 31 (Q4_0_4_4, removed"),
                                              (42, "ggml type 42, outside ggml's registry")])
def test_an_ollama_blobs_type_is_cg009_naming_tensor_id_and_llama_cpp(tmp_path: Path, ggml_type: int,
                                                                      words: str) -> None:
    data = write_gguf(tmp_path / "healthy.gguf", _mxfp4_experts).read_bytes()
    damaged = _retype(_retype(data, b"blk.0.ffn_gate_exps.weight", ggml_type), b"blk.0.ffn_down_exps.weight",
                      ggml_type)
    (tmp_path / "sha256-blob.gguf").write_bytes(damaged)
    scan = ours(tmp_path / "sha256-blob.gguf")
    [finding] = scan.findings
    assert (finding.code, finding.severity.value, finding.tensor) == ("CG009", "error", "blk.0.ffn_gate_exps.weight")
    assert finding.message.startswith("tensor 'blk.0.ffn_gate_exps.weight' and 1 more: " + words), finding.message
    assert "llama.cpp refuses the file" in finding.message
    from guard.cli import main

    assert main(["scan", "--no-summary", "--format", "text", str(tmp_path / "sha256-blob.gguf")]) == 1


@pytest.mark.slow
def test_every_truncation_of_a_real_file_is_cg001(tmp_path: Path) -> None:
    data = write_gguf(tmp_path / "m.gguf", llama_like).read_bytes()
    tensors = ours(tmp_path / "m.gguf").tensors
    header_end = min(t.data_start for t in tensors)
    data_end = max(t.data_end for t in tensors)  # the writer's padding after it may go
    for cut in (*range(0, header_end, 7), header_end + 1, data_end - 1):
        result = bounded_scan(data[:cut], "model.gguf")
        assert_well_behaved(result, data)
        assert result.scan.format is None, cut


def test_a_string_longer_than_the_limit_is_refused_before_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from guard.readers.gguf import file as reader

    monkeypatch.setattr(reader, "MAX_STRING", 1024)
    data = _file([_kv(b"k" * 2048, 0, b"\1")], [])
    assert_refused(data, "model.gguf", "key of 2,048 bytes")
