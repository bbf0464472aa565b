"""Zip mutants the agreement runs (``fuzz/agreement.py --count 3000 --seed 2`` and ``--seed 3``,
npz and torch-zip) left unexplained, each pinned, with the boundary next to it.

Every input is a file numpy.savez or torch.save wrote, with the one change the seeded
mutation made planted by hand.  Each test asserts our verdict, the reference loader's, and
the category the differential harness gives the pair (``explain``: "agree" or a documented one).
"""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
from fuzz_inputs import FILE_NAMES, REFERENCES, bounded_scan, explain

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

_EOCD = struct.Struct("<4sHHHHIIH")


def _write(path: Path, data: bytes) -> bytes:
    path.write_bytes(data)
    return path.read_bytes()


def _verdicts(fmt: str, data: bytes) -> tuple[str | None, object, object]:
    ours = bounded_scan(data, FILE_NAMES[fmt])
    theirs = REFERENCES[fmt](data)
    return explain(fmt, ours, theirs), ours, theirs


def _with_end_record(data: bytes, **fields: int) -> bytes:
    """``data`` with fields of its End Of Central Directory record replaced (by name)."""
    at = data.rfind(b"PK\x05\x06")
    names = ("sig", "disk", "cd_disk", "on_disk", "count", "cd_size", "cd_offset", "comment_length")
    record = dict(zip(names, _EOCD.unpack_from(data, at)))
    record.update(fields)
    return data[:at] + _EOCD.pack(*record.values()) + data[at + _EOCD.size:]


def _central_entry(data: bytes, name: bytes) -> int:
    """Offset of the central directory entry named ``name``."""
    at = struct.unpack_from("<I", data, data.rfind(b"PK\x05\x06") + 16)[0]  # the directory's offset
    while data[at:at + 4] == b"PK\x01\x02":
        nlen, elen, clen = struct.unpack_from("<HHH", data, at + 28)
        if data[at + 46:at + 46 + nlen] == name:
            return at
        at += 46 + nlen + elen + clen
    raise AssertionError(f"{name!r} is not in the central directory")


def _local_header_of(data: bytes, name: bytes) -> int:
    return struct.unpack_from("<I", data, _central_entry(data, name) + 42)[0]


# ------------------------------------------------------------------ .npz (numpy.load, Python's zipfile)

ARRAYS = {"embed": np.ones((3, 4), np.float16), "ids": np.arange(4), "flag": np.array(True)}
INVENTORY = {"embed": ("F16", (3, 4)), "ids": ("I64", (4,)), "flag": ("BOOL", ())}


def _npz(tmp_path: Path, save: object) -> bytes:
    path = tmp_path / "weights.npz"
    save(path, **ARRAYS)  # type: ignore[operator]
    return path.read_bytes()


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["savez", "savez_compressed"])
def test_npz_end_record_that_undercounts_its_entries_lists_every_member(tmp_path: Path, save: object) -> None:
    """The end record says 1 entry of 3.  zipfile reads the directory by its size and never
    looks at the count, so numpy.load returns all three arrays; the scan listed only the first
    (the other two were never looked at).  Now the directory is read as zipfile reads it."""
    data = _write(tmp_path / "undercounted.npz", _with_end_record(_npz(tmp_path, save), count=1))
    with np.load(io.BytesIO(data)) as loaded:
        assert sorted(loaded.files) == sorted(ARRAYS)
    category, ours, _theirs = _verdicts("npz", data)
    assert ours.valid, ours.reason
    assert ours.inventory == INVENTORY
    assert category == "agree"


def test_npz_end_record_that_places_an_empty_directory_after_the_members_is_refused(tmp_path: Path) -> None:
    """The end record declares no entry and a directory of 0 bytes at offset 0.  zipfile takes
    the bytes before the end record for data prepended to an empty archive, and numpy.load
    returns no array at all from a file that holds three: refused (``stricter-zip``)."""
    data = _write(tmp_path / "emptied.npz",
                  _with_end_record(_npz(tmp_path, np.savez), on_disk=0, count=0, cd_size=0, cd_offset=0))
    with np.load(io.BytesIO(data)) as loaded:
        assert loaded.files == []
    category, ours, _theirs = _verdicts("npz", data)
    assert not ours.valid
    assert "stray bytes between the zip directory and its end record" in ours.reason
    assert category == "stricter-zip"


# ------------------------------------------------------------------ torch zip (torch.load, miniz)

STATE = {"w": torch.ones(2, 2, dtype=torch.bfloat16), "e": torch.zeros(0, 3), "i8": torch.ones(2, dtype=torch.int8)}
TORCH_INVENTORY = {"w": ("BF16", (2, 2)), "e": ("F32", (0, 3)), "i8": ("I8", (2,))}


def _torch_zip(tmp_path: Path, state: dict[str, object] | None = None) -> bytes:
    path = tmp_path / "pytorch_model.bin"
    torch.save(STATE if state is None else state, path)
    return path.read_bytes()


def _storage_record(data: bytes, *, empty: bool) -> bytes:
    """The directory name of a storage record that is (or is not) empty."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = [info.filename for info in archive.infolist()
                 if "/data/" in info.filename and (info.file_size == 0) == empty]
    assert names, names
    return names[0].encode()


def test_torch_zip_empty_storage_with_a_damaged_local_header_loads(tmp_path: Path) -> None:
    """miniz hands back a record of no bytes before it reads its local header, so torch.load
    reads a file whose empty tensor's record has a damaged one, with the right tensors.  The
    scan refused it ("bad zip local header"); now it reads it as torch does."""
    data = bytearray(_torch_zip(tmp_path))
    at = _local_header_of(bytes(data), _storage_record(bytes(data), empty=True))
    data[at:at + 4] = b"data"  # the signature overwritten, as the seed-3 splice did
    data = bytearray(_write(tmp_path / "damaged.bin", bytes(data)))
    category, ours, theirs = _verdicts("torch-zip", bytes(data))
    assert theirs == TORCH_INVENTORY
    assert ours.valid, ours.reason
    assert ours.inventory == TORCH_INVENTORY
    assert category == "agree"


def test_torch_zip_storage_with_bytes_and_a_damaged_local_header_stays_refused(tmp_path: Path) -> None:
    """The same damage on a record with bytes: torch.load reads the local header and fails."""
    data = bytearray(_torch_zip(tmp_path))
    at = _local_header_of(bytes(data), _storage_record(bytes(data), empty=False))
    data[at:at + 4] = b"data"
    category, ours, theirs = _verdicts("torch-zip", bytes(data))
    assert isinstance(theirs, str) and "torch.load" in theirs
    assert "bad zip local header" in ours.reason
    assert category == "agree"


def test_torch_zip_version_record_under_another_case_loads(tmp_path: Path) -> None:
    """One flipped bit makes the directory say ``archive/Version``.  miniz finds records by
    name ignoring case, so torch.load reads the version and the right tensors; the scan said
    "zip has no version record".  The small records are now found as miniz finds them."""
    data = bytearray(_torch_zip(tmp_path))
    prefix = zipfile.ZipFile(io.BytesIO(bytes(data))).namelist()[0].split("/", 1)[0].encode()
    at = _central_entry(bytes(data), prefix + b"/version") + 46 + len(prefix) + 1
    data[at] ^= 0x20  # "v" -> "V"
    data = bytearray(_write(tmp_path / "Version.bin", bytes(data)))
    category, ours, theirs = _verdicts("torch-zip", bytes(data))
    assert theirs == TORCH_INVENTORY
    assert ours.valid, ours.reason
    assert ours.inventory == TORCH_INVENTORY
    assert category == "agree"


def test_torch_zip_two_records_whose_names_differ_only_in_case_are_refused(tmp_path: Path) -> None:
    """``archive/version`` and ``archive/VERSION``: miniz would read either one; refused
    (``stricter-zip``).  The archive is torch.save's, copied by zipfile with the twin added."""
    original = _torch_zip(tmp_path)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as source, zipfile.ZipFile(out, "w") as target:
        prefix = source.namelist()[0].split("/", 1)[0]
        for info in source.infolist():
            target.writestr(info, source.read(info))
        target.writestr(f"{prefix}/VERSION", b"3\n")
    data = _write(tmp_path / "twins.bin", out.getvalue())
    category, ours, _theirs = _verdicts("torch-zip", data)
    assert not ours.valid
    assert "differ only in case" in ours.reason
    assert category == "stricter-zip"


@pytest.mark.parametrize(("size", "loads"), [(12, False), (43, False), (44, True), (1000, True)])
def test_torch_zip_zip64_end_record_that_declares_itself_short_is_refused(tmp_path: Path, size: int,
                                                                        loads: bool) -> None:
    """torch.save writes a zip64 end record, whose size field counts the 44 bytes after it.
    miniz refuses a record that declares fewer (torch.load: "failed reading zip archive"); the
    scan read such a file (the seed-4 torch-export mutant had 12).  Now refused as miniz refuses
    it; a larger size is not held against the file, by either."""
    data = bytearray(_torch_zip(tmp_path))
    struct.pack_into("<Q", data, data.rfind(b"PK\x06\x06") + 4, size)
    category, ours, theirs = _verdicts("torch-zip", bytes(data))
    assert isinstance(theirs, dict) == loads, theirs
    assert ours.valid == loads, ours.reason
    if not loads:
        assert "zip64 end record declares" in ours.reason
    assert category == "agree"


# ------------------------------------------------------------------ .keras (keras.saving.load_model, Python's zipfile)

def _keras_file(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A .keras archive Keras itself wrote (tests/real_writers.py: metadata.json, config.json,
    model.weights.h5, stored)."""
    import importlib.util

    pytest.importorskip("h5py")
    if importlib.util.find_spec("keras") is None:
        pytest.skip("keras is not installed")
    from real_writers import built

    out, _reference = built("keras", tmp_path_factory)
    return (out / "seq_float32.keras").read_bytes()


def test_keras_end_record_that_undercounts_its_entries_loads(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The end record counts 1 entry of 3.  keras.saving.load_model opens the archive with
    zipfile, which reads the directory by its size and never looks at the count: the model
    loads.  The scan read one entry and found "no config.json"; the directory is now read as
    zipfile reads it (as the .npz reader does)."""
    data = _with_end_record(_keras_file(tmp_path_factory), on_disk=1, count=1)
    assert len(zipfile.ZipFile(io.BytesIO(data)).namelist()) == 3
    category, ours, theirs = _verdicts("keras", data)
    assert isinstance(theirs, dict) and theirs
    assert ours.valid, ours.reason
    assert ours.inventory == theirs
    assert category == "agree"


def test_keras_metadata_entry_that_overlaps_config_is_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The seed-3 mutant: metadata.json's compressed size in the directory grew past the start
    of config.json.  Keras never reads metadata.json, so it loads the model; the scan refuses
    entries that share bytes (the overlapping-entry zip bomb) whichever member they are:
    ``stricter-zip``.  The entry count was not the cause."""
    data = bytearray(_keras_file(tmp_path_factory))
    at = _central_entry(bytes(data), b"metadata.json")
    size = struct.unpack_from("<I", data, at + 20)[0]
    struct.pack_into("<I", data, at + 20, size + 76)  # 27 -> 103 in the seed-3 mutant
    category, ours, theirs = _verdicts("keras", bytes(data))
    assert isinstance(theirs, dict) and theirs
    assert not ours.valid
    assert "zip entry 'metadata.json' overlaps 'config.json'" in ours.reason
    assert category == "stricter-zip"


# ------------------------------------------------------------------ the samples the agreement runs mutate

def _export_module(folder: Path) -> object:
    """tests/fuzz_formats_export.py, copied into ``folder`` and imported from there under its own name."""
    import importlib.util

    folder.mkdir()
    path = folder / "fuzz_formats_export.py"
    path.write_bytes((Path(__file__).parent / "fuzz_formats_export.py").read_bytes())
    spec = importlib.util.spec_from_file_location("fuzz_formats_export", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pt2_samples_are_the_same_bytes_from_any_checkout(tmp_path: Path) -> None:
    """torch.export.save wrote each node's stack trace (absolute paths, line numbers), so the
    .pt2 samples, and the seeded mutants of the torch-export agreement, changed with the
    checkout's path.  Written from two copies of the module at two paths, they are now equal,
    and each still loads in torch.export.load as the scan reads it."""
    first = _export_module(tmp_path / "checkout")._pt2_samples()  # type: ignore[attr-defined]
    second = _export_module(tmp_path / "another-checkout")._pt2_samples()  # type: ignore[attr-defined]
    assert first == second
    for data in first:
        assert b"stack_trace" not in data and str(tmp_path).encode() not in data
        category, ours, theirs = _verdicts("torch-export", data)
        assert ours.valid and isinstance(theirs, dict) and ours.inventory == theirs
        assert category == "agree"


def test_keras_samples_do_not_carry_the_time_of_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """zipfile stamps a member written by name with the current time: the .keras samples (and
    their mutants) changed from one run to the next.  Now the same bytes at any time."""
    import time

    from fuzz_inputs import sample_checkpoints

    first = sample_checkpoints("keras")
    monkeypatch.setattr(time, "time", lambda: 1_000_000_000.0)  # 2001
    assert sample_checkpoints("keras") == first


def test_pt2_mutant_whose_nested_record_is_marked_as_a_folder_is_that_category(tmp_path: Path) -> None:
    """The seed-3 torch-export mutant: the directory entry of data.pkl inside the archive's
    sample_inputs/model.pt (a torch.save file) has its external attributes set to 0xffff, the
    DOS folder bit among them.  miniz then hands torch uninitialised memory for it, and the
    harness's check for that case read the nested file with zipfile, whose CRC check failed
    (the nested file's bytes changed): the mutant came out unexplained.  It is read without
    the CRC check now: ``folder-attribute``."""
    from fuzz_formats_export import _has_folder_records, _pt2_samples

    data = bytearray(_pt2_samples()[0])
    outer = zipfile.ZipFile(io.BytesIO(bytes(data)))
    nested = outer.getinfo(next(n for n in outer.namelist() if n.endswith("sample_inputs/model.pt")))
    start = _local_header_of(bytes(data), nested.filename.encode())
    start += 30 + sum(struct.unpack_from("<HH", data, start + 26))
    inner = bytes(data[start:start + nested.compress_size])
    pickle = next(n for n in zipfile.ZipFile(io.BytesIO(inner)).namelist() if n.endswith("/data.pkl"))
    at = start + _central_entry(inner, pickle.encode()) + 36
    data[at:at + 4] = b"\xff\xff\xff\xff"  # internal attributes, the low bytes of the external ones
    assert _has_folder_records(bytes(data))
    category, ours, _theirs = _verdicts("torch-export", bytes(data))
    assert ours.valid, ours.reason
    assert category in ("agree", "folder-attribute")


def test_pt2_weight_record_under_another_case_is_refused() -> None:
    """The seed-4 torch-export mutant: one flipped bit makes the directory say
    ``archive/dAta/weights/weight_0``.  miniz finds records ignoring case, so torch.export.load
    loads the weights; the scan said the config names a record "which the archive does not
    hold".  As for a torch zip's storages, a record found only under another case is refused,
    and says so: ``stricter-zip``."""
    from fuzz_formats_export import _pt2_samples

    data = bytearray(_pt2_samples()[1])
    name = next(n for n in zipfile.ZipFile(io.BytesIO(bytes(data))).namelist() if n.endswith("/weights/weight_0"))
    at = _central_entry(bytes(data), name.encode()) + 46 + name.index("/data/") + 2
    data[at] ^= 0x20  # "a" -> "A"
    category, ours, theirs = _verdicts("torch-export", bytes(data))
    assert isinstance(theirs, dict) and theirs
    assert not ours.valid
    assert "differ only in case" in ours.reason
    assert category == "stricter-zip"
