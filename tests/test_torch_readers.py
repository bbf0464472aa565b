"""torch zip and legacy readers: differential against torch.load, corruptions, read economy."""

from __future__ import annotations

import io
import pickle
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from bounds import no_hang, traced

from guard.dtypes import TORCH_NAMES
from guard.errors import MalformedCheckpoint
from guard.readers import scan_file
from guard.readers.torch.legacy import read_torch_legacy
from guard.readers.torch.pickle import ALLOWED_GLOBALS, ITEMSIZES, STORAGE_DTYPES
from guard.readers.torch.zip import locate_torch_zip_storages, read_torch_zip
from guard.sources import BytesSource, LocalFile
from guard.tensors import FileScan

FORMATS = {"torch-zip": True, "torch-legacy": False}  # format -> _use_new_zipfile_serialization


def _scan(path: Path) -> FileScan:
    with LocalFile(path, name=path.name) as src:
        return scan_file(src)


def _save(obj: object, path: Path, fmt: str) -> Path:
    torch.save(obj, path, _use_new_zipfile_serialization=FORMATS[fmt])
    return path


def _code(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    return {"qint8": "I8", "quint8": "U8", "qint32": "I32"}.get(name, TORCH_NAMES.get(name, name))


def _flatten(obj: object, prefix: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """torch.load's result named the way the reader names it."""
    if isinstance(obj, torch.Tensor):
        return {".".join(prefix) or "<root>": obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    out: dict[str, torch.Tensor] = {}
    for key, value in items:
        out.update(_flatten(value, (*prefix, str(key))))
    return out


def _assert_matches_torch(path: Path, scan: FileScan) -> None:
    loaded = _flatten(torch.load(path, weights_only=True))
    ours = {t.name: t for t in scan.tensors}
    assert set(ours) == set(loaded)
    for name, tensor in loaded.items():
        info = ours[name]
        assert (info.dtype, info.shape) == (_code(tensor.dtype), tuple(tensor.shape)), name
        assert info.stride == (None if tensor.is_contiguous() else tuple(tensor.stride())), name
    # Views and tied weights share a storage exactly when torch's tensors do.
    by_ptr: dict[int, set[str | None]] = {}
    for name, tensor in loaded.items():
        if tensor.numel():
            by_ptr.setdefault(tensor.untyped_storage().data_ptr(), set()).add(ours[name].storage)
    assert all(len(keys) == 1 for keys in by_ptr.values())
    assert len({next(iter(k)) for k in by_ptr.values()}) == len(by_ptr)


def _assert_bytes_on_disk(path: Path, scan: FileScan) -> None:
    raw = path.read_bytes()
    loaded = _flatten(torch.load(path, weights_only=True))
    for info in scan.tensors:
        tensor = loaded[info.name]
        assert info.data_start is not None and info.data_end is not None, info.name
        on_disk = raw[info.data_start : info.data_end]
        storage = bytes(tensor.untyped_storage().cpu())
        start = tensor.storage_offset() * tensor.element_size()
        assert on_disk == storage[start : start + len(on_disk)], info.name
        if tensor.is_contiguous():
            expected = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
            assert on_disk == expected, info.name


# torch 2.13 writes these to legacy files (untyped storage + _rebuild_tensor_v3) but cannot
# load them back ("UntypedStorage has no attribute dtype"); the zip format round-trips them.
V3_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64)


def _many_dtypes(fmt: str = "torch-zip") -> dict[str, object]:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    w = torch.randn(4, 6)
    out: dict[str, object] = {
        str(dtype).removeprefix("torch."): (base > 0.5 if dtype is torch.bool else base.to(dtype))
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                      torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
                      torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32,
                      torch.uint64, torch.complex64)
        if fmt == "torch-zip" or dtype not in V3_DTYPES
    }
    out |= {
        "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 5), "w": w, "w_t": w.T,
        "w_rows": w[1:3], "w_cols": w[:, 2:], "tied_a": w, "param": torch.nn.Parameter(torch.ones(3)),
        "nested": {"deeper": {"x": torch.ones(2, 2, dtype=torch.float16)}, "list": [torch.zeros(1), 3]},
        "epoch": 7, "name": "run-1",
    }
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_dtypes_views_and_nesting_match_torch_load(tmp_path: Path, fmt: str) -> None:
    path = _save(_many_dtypes(fmt), tmp_path / "model.pt", fmt)
    scan = _scan(path)
    assert scan.format == fmt and scan.findings == ()
    _assert_matches_torch(path, scan)
    by_name = {t.name: t for t in scan.tensors}
    assert by_name["w_t"].stride == (1, 6) and by_name["w_t"].storage == by_name["w"].storage
    assert by_name["tied_a"].storage == by_name["w"].storage
    assert by_name["nested.deeper.x"].dtype == "F16" and by_name["nested.list.0"].shape == (1,)


def test_zip_data_offsets_point_at_the_tensor_bytes(tmp_path: Path) -> None:
    path = _save(_many_dtypes(), tmp_path / "model.bin", "torch-zip")
    assert all(t.data_start is None for t in _scan(path).tensors)  # a plain scan pays no extra reads
    with LocalFile(path) as src:
        located = read_torch_zip(src, locate_data=True)
    _assert_bytes_on_disk(path, located)
    with LocalFile(path) as src, zipfile.ZipFile(path) as zf:
        spans = locate_torch_zip_storages(src)
        raw = path.read_bytes()
        for key, (start, end) in spans.items():
            assert raw[start:end] == zf.read(f"model/data/{key}")
            assert start % 64 == 0  # torch aligns storages for mmap


def test_legacy_data_offsets_point_at_the_tensor_bytes(tmp_path: Path) -> None:
    path = _save(_many_dtypes("torch-legacy"), tmp_path / "model.pt", "torch-legacy")
    _assert_bytes_on_disk(path, _scan(path))


def test_legacy_new_dtypes_are_read_though_torch_cannot_load_them(tmp_path: Path) -> None:
    tensors = {str(d): torch.zeros(3, dtype=torch.float32).to(d) for d in V3_DTYPES}
    path = _save(tensors, tmp_path / "v3.pt", "torch-legacy")
    assert _torch_fails(path)
    scan = _scan(path)
    assert scan.findings == ()
    assert {t.name: t.dtype for t in scan.tensors} == {str(d): _code(d) for d in V3_DTYPES}
    raw = path.read_bytes()
    assert all(raw[t.data_start : t.data_end] == b"\0" * (t.data_end - t.data_start)
               for t in scan.tensors if t.data_start is not None)


@pytest.mark.parametrize("fmt", FORMATS)
def test_transformers_state_dict_and_training_checkpoint(tmp_path: Path, fmt: str) -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    model = BertModel(config)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4, dtype=torch.long)).last_hidden_state.sum().backward()
    opt.step()
    state = _save(model.state_dict(), tmp_path / "pytorch_model.bin", fmt)
    scan = _scan(state)
    _assert_matches_torch(state, scan)
    assert "encoder.layer.1.output.LayerNorm.weight" in {t.name for t in scan.tensors}
    ckpt = _save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3},
                 tmp_path / "ckpt.pt", fmt)
    scan = _scan(ckpt)
    assert scan.findings == ()
    _assert_matches_torch(ckpt, scan)
    assert "optimizer.state.0.exp_avg" in {t.name for t in scan.tensors}


@pytest.mark.parametrize("fmt", FORMATS)
def test_bare_tensor_and_quantized_tensor(tmp_path: Path, fmt: str) -> None:
    bare = _save(torch.ones(2, 3, dtype=torch.bfloat16), tmp_path / "t.pt", fmt)
    assert [(t.name, t.dtype, t.shape) for t in _scan(bare).tensors] == [("<root>", "BF16", (2, 3))]
    q = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 3, torch.qint8)
    path = _save({"q": q}, tmp_path / "q.pt", fmt)
    scan = _scan(path)
    assert scan.findings == ()
    _assert_matches_torch(path, scan)


def test_unknown_torch_dtype_is_cg005(tmp_path: Path) -> None:
    path = _save({"c": torch.ones(2, dtype=torch.complex128)}, tmp_path / "c.pt", "torch-zip")
    scan = _scan(path)
    assert [f.code for f in scan.findings] == ["CG005"]
    assert scan.tensors[0].dtype == "complex128"


def test_allowlist_never_exceeds_torch_and_tables_match_torch() -> None:
    from torch._weights_only_unpickler import _get_allowed_globals

    assert ALLOWED_GLOBALS <= set(_get_allowed_globals())
    for name, size in ITEMSIZES.items():
        assert getattr(torch, name).itemsize == size, name
    for cls, dtype in STORAGE_DTYPES.items():
        assert str(getattr(torch, cls).dtype) == f"torch.{dtype}", cls


def test_scan_reads_a_tiny_share_of_a_large_zip(tmp_path: Path) -> None:
    path = _save({"big": torch.empty(60_000_000), "small": torch.ones(3)}, tmp_path / "big.bin",
                 "torch-zip")
    with LocalFile(path) as src:
        scan = scan_file(src)
        # the directory, data.pkl, the five small records torch reads, one local header per storage
        assert src.bytes_read < 8 * 1024 and src.reads <= 12
    assert scan.size > 200_000_000 and scan.bytes_read < 8 * 1024
    assert {t.name for t in scan.tensors} == {"big", "small"}


def test_zip_with_comment_and_zip64_records_still_reads(tmp_path: Path) -> None:
    path = _save({"w": torch.ones(2)}, tmp_path / "c.bin", "torch-zip")
    raw = path.read_bytes()
    sig, d, cd, n1, n, cd_size, cd_off, _ = struct.unpack("<4sHHHHIIH", raw[-22:])
    z64_at = len(raw) - 22
    zip64 = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n1, n, cd_size, cd_off)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, z64_at, 1)
    comment = b"x" * 3000
    eocd = struct.pack("<4sHHHHIIH", sig, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, len(comment))
    path.write_bytes(raw[:z64_at] + zip64 + locator + eocd + comment)
    assert torch.load(path, weights_only=True)["w"].shape == (2,)
    scan = _scan(path)
    assert scan.format == "torch-zip" and [t.name for t in scan.tensors] == ["w"]


# ---- corruptions: every one is CG001, fast, with no exception --------------------------------

def _assert_cg001(source: LocalFile | BytesSource, contains: str = "") -> FileScan:
    with no_hang():
        scan = scan_file(source)
    assert [f.code for f in scan.findings] == ["CG001"], scan.findings
    assert contains in scan.findings[0].message
    return scan


def _torch_zip(pickle_bytes: bytes, *, storages: dict[str, bytes] | None = None,
               method: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(zipfile.ZipInfo("archive/data.pkl"), pickle_bytes, compress_type=method)
        for key, data in (storages or {}).items():
            zf.writestr(f"archive/data/{key}", data)
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


def _torch_fails(path: Path) -> bool:
    try:
        torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - any failure of torch's own loader counts
        return True
    return False


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncation_agrees_with_torch(tmp_path: Path, fmt: str) -> None:
    good = _save({"a": torch.randn(5, 7), "b": torch.arange(4), "c": torch.ones(3, dtype=torch.float16)},
                 tmp_path / "good.pt", fmt)
    raw = good.read_bytes()
    cuts = sorted({*range(0, len(raw), max(1, len(raw) // 60)), *range(len(raw) - 40, len(raw))})
    for cut in cuts:
        path = tmp_path / f"cut{cut}.pt"
        path.write_bytes(raw[:cut])
        with LocalFile(path) as src, no_hang():
            scan = scan_file(src)
        ours_fail = any(f.code == "CG001" for f in scan.findings)
        assert ours_fail == _torch_fails(path), f"cut at {cut} of {len(raw)}"
        assert ours_fail


def test_flipped_bytes_in_data_pkl_never_raise(tmp_path: Path) -> None:
    good = _save({"a": torch.randn(3, 4), "b": torch.ones(2, dtype=torch.bfloat16).T},
                 tmp_path / "good.bin", "torch-zip")
    raw = good.read_bytes()
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo("good/data.pkl")
    start = info.header_offset + 30 + len(info.filename) + struct.unpack(
        "<H", raw[info.header_offset + 28 : info.header_offset + 30])[0]
    for pos in range(start, start + info.file_size):
        for flip in (0x01, 0x80, 0xFF):
            mutated = bytearray(raw)
            mutated[pos] ^= flip
            with no_hang():
                scan = scan_file(BytesSource(bytes(mutated), name="m.bin"))
            assert scan.format == "torch-zip" or [f.code for f in scan.findings] == ["CG001"]


def test_zip_without_data_pkl(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data/0", b"\0" * 8)
    _assert_cg001(BytesSource(buf.getvalue(), name="x.bin"), "data.pkl")
    _assert_cg001(BytesSource(b"PK\x05\x06" + b"\0" * 18, name="empty.bin"))


def test_deflated_data_pkl_is_capped_and_small_ones_still_read(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.bin"
    with zipfile.ZipFile(bomb, "w") as zf:
        info = zipfile.ZipInfo("archive/data.pkl")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as out:
            out.write(b"\x80\x02]")
            for _ in range(80):
                out.write(b"\0" * (1 << 20))
    assert bomb.stat().st_size < 2_000_000
    with traced() as peak, LocalFile(bomb) as src:
        _assert_cg001(src)
    assert peak.bytes < 200 * 1024 * 1024
    good = _save({"w": torch.ones(3)}, tmp_path / "good.bin", "torch-zip")
    with zipfile.ZipFile(good) as src_zip:
        data_pkl = src_zip.read("good/data.pkl")
        storage = src_zip.read("good/data/0")
    scan = scan_file(BytesSource(_torch_zip(data_pkl, storages={"0": storage},
                                            method=zipfile.ZIP_DEFLATED), name="d.bin"))
    assert [(t.name, t.dtype) for t in scan.tensors] == [("w", "F32")]


def test_eocd_garbage(tmp_path: Path) -> None:
    raw = _save({"w": torch.ones(3)}, tmp_path / "g.bin", "torch-zip").read_bytes()
    _assert_cg001(BytesSource(raw[:-22] + bytes(range(22)), name="g.bin"), "End Of Central")
    # torch always writes zip64 records (EOCD64 + locator) before the EOCD; they win.
    z64 = len(raw) - 22 - 20 - 56
    assert raw[z64 : z64 + 4] == b"PK\x06\x06"
    past_end = raw[: z64 + 48] + struct.pack("<Q", len(raw)) + raw[z64 + 56 :]
    _assert_cg001(BytesSource(past_end, name="g.bin"), "directory")
    huge_count = raw[: z64 + 32] + struct.pack("<Q", 2**40) + raw[z64 + 40 :]
    _assert_cg001(BytesSource(huge_count, name="g.bin"), "directory")
    locator_garbage = raw[: len(raw) - 34] + struct.pack("<Q", 2**63) + raw[len(raw) - 26 :]
    _assert_cg001(BytesSource(locator_garbage, name="g.bin"), "zip64")
    plain = _torch_zip(b"\x80\x02}.")  # Python's zipfile: no zip64 records
    assert scan_file(BytesSource(plain, name="p.bin")).findings == ()
    bad_offset = plain[:-6] + struct.pack("<I", len(plain)) + plain[-2:]
    _assert_cg001(BytesSource(bad_offset, name="p.bin"), "directory")
    bad_count = plain[:-12] + struct.pack("<H", 0xFFFE) + plain[-10:]
    _assert_cg001(BytesSource(bad_count, name="p.bin"), "directory")


@pytest.mark.parametrize("pickle_bytes, contains", [
    (b"\x80\x02" + b"]" * 10_000 + b"a" * 9_999 + b".", "deep"),
    (b"\x80\x02" + b"(" * 10_000 + b"t" * 10_000 + b".", "MARK"),
    (b"\x80\x04\x8d" + struct.pack("<Q", 2**40) + b"abc.", "BINUNICODE8"),
    (b"\x80\x02\x8b" + struct.pack("<i", 2**31 - 1) + b"x.", "LONG4"),
    (b"\x80\x02h\x05.", "memo"),
    (b"\x80\x02R.", "underflow"),
    (b"\x80\x02t.", "MARK"),
    (b"\xff\xfe not a pickle", "opcode"),
    (b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01", "STOP"),
])
def test_hostile_structures_are_cg001(pickle_bytes: bytes, contains: str) -> None:
    with traced() as peak, no_hang():
        scan = scan_file(BytesSource(_torch_zip(pickle_bytes), name="h.bin"))
    assert peak.bytes < 64 * 1024 * 1024
    codes = [f.code for f in scan.findings]
    assert codes[-1] == "CG001" and contains in scan.findings[-1].message, scan.findings


def test_missing_storage_record_and_out_of_bounds_view() -> None:
    def pkl(numel: int, size: int) -> bytes:
        pid = ("storage", "FloatStorage", "0", "cpu", numel)
        body = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(" + b"(X\x07\x00\x00\x00storage"
                + b"ctorch\n" + pid[1].encode() + b"\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK"
                + bytes([numel]) + b"tQK\x00K" + bytes([size]) + b"\x85K\x01\x85\x89)tR.")
        return body
    ok = BytesSource(_torch_zip(pkl(4, 4), storages={"0": b"\0" * 16}), name="ok.bin")
    assert [(t.name, t.shape) for t in scan_file(ok).tensors] == [("<root>", (4,))]
    _assert_cg001(BytesSource(_torch_zip(pkl(4, 4)), name="m.bin"), "does not hold")
    _assert_cg001(BytesSource(_torch_zip(pkl(4, 9), storages={"0": b"\0" * 16}), name="o.bin"),
                  "runs past")
    _assert_cg001(BytesSource(_torch_zip(pkl(4, 4), storages={"0": b"\0" * 8}), name="s.bin"),
                  "shorter")


def _legacy(*pickles: bytes) -> bytes:
    head = [pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2), pickle.dumps(1001, protocol=2),
            pickle.dumps({"protocol_version": 1001, "little_endian": True}, protocol=2)]
    return b"".join(head) + b"".join(pickles)


def test_legacy_structural_problems() -> None:
    keys = pickle.dumps([], protocol=2)
    assert scan_file(BytesSource(_legacy(pickle.dumps({}, protocol=2), keys), name="ok.pt")).findings == ()
    huge = b"\x80\x04\x8e" + struct.pack("<Q", 2**40) + b"x."
    with traced() as peak:
        _assert_cg001(BytesSource(_legacy(huge, keys), name="h.pt"), "past the end")
    assert peak.bytes < 16 * 1024 * 1024
    _assert_cg001(BytesSource(_legacy(pickle.dumps({}, protocol=2)), name="k.pt"), "past the end")
    deep = b"\x80\x02" + b"]" * 10_000 + b"a" * 9_999 + b"."
    _assert_cg001(BytesSource(_legacy(deep, keys), name="d.pt"), "deep")
    with pytest.raises(MalformedCheckpoint, match="magic"):
        read_torch_legacy(BytesSource(pickle.dumps(5, protocol=2) * 5))


def test_legacy_tar_variant_is_cg001(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    with tarfile.open(path, "w") as tar:
        for name in ("sys_info", "pickle", "storages", "tensors"):
            data = pickle.dumps({}, protocol=2)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _assert_cg001(LocalFile(path))
    with LocalFile(path) as src, pytest.raises(MalformedCheckpoint, match="tar-format"):
        read_torch_legacy(src)


def test_scan_imports_no_framework(tmp_path: Path) -> None:
    zip_path = _save({"w": torch.ones(2)}, tmp_path / "a.bin", "torch-zip")
    legacy_path = _save({"w": torch.ones(2)}, tmp_path / "b.pt", "torch-legacy")
    code = (
        "import sys\nfrom guard.readers import scan_file\nfrom guard.sources import LocalFile\n"
        f"for p in ({str(zip_path)!r}, {str(legacy_path)!r}):\n"
        "    assert [t.name for t in scan_file(LocalFile(p)).tensors] == ['w']\n"
        "heavy = {'torch', 'numpy', 'jax', 'flax', 'transformers'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
