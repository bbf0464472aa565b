"""NumPy reader: np.save / savez / savez_compressed files read back as numpy.load reads them; hostile ones.

The differential reference is ``numpy.load(mmap_mode="r")`` for ``.npy`` (header
only, as our scan) and ``numpy.load`` of each member for ``.npz``.  Malformed
files are hand-made (a zip bomb of overlapping entries, lying member sizes,
headers that are not dict literals): CG001, fast, small, never an exception.
"""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
from fuzz_formats_a import numpy_code
from fuzz_inputs import assert_refused

from guard.readers import scan_file
from guard.sources import BytesSource, LocalFile

np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

ARRAYS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f16": np.ones((2, 2, 2), np.float16),
    "f64_fortran": np.asfortranarray(np.ones((2, 3))),
    "i64": np.arange(5),
    "u8": np.zeros(7, np.uint8),
    "bool": np.array([True, False]),
    "c64": np.ones(2, np.complex64),
    "c128": np.ones(2, np.complex128),
    "scalar": np.array(1.5, np.float32),
    "empty": np.zeros((0, 3), np.float32),
    "big_endian": np.ones(3, ">f4"),
    "bf16": np.ones(4, ml_dtypes.bfloat16),
}


def _scan(path: Path):  # noqa: ANN202
    with LocalFile(path, name=path.name) as source:
        return scan_file(source)


@pytest.mark.parametrize("key", list(ARRAYS))
def test_npy_reads_back_what_numpy_load_reports(tmp_path: Path, key: str) -> None:
    path = tmp_path / f"{key}.npy"
    np.save(path, ARRAYS[key])
    scan = _scan(path)
    theirs = np.load(path, mmap_mode="r")
    assert [(t.name, t.dtype, t.shape) for t in scan.tensors] == [(key, numpy_code(theirs.dtype), theirs.shape)]
    tensor = scan.tensors[0]
    if key == "bf16":  # ml_dtypes' bfloat16 is saved as opaque '<V2': said so, never guessed
        assert tensor.dtype == "V2" and [f.code for f in scan.findings] == ["CG005"]
        assert "bfloat16" in scan.findings[0].message
        return
    assert scan.findings == ()
    if key == "big_endian":
        assert tensor.data_start is None
    else:
        assert (tensor.data_start, tensor.data_end) == (theirs.offset, theirs.offset + theirs.nbytes)
        assert path.read_bytes()[tensor.data_start:tensor.data_end] == np.ascontiguousarray(
            theirs).tobytes(order="F" if key == "f64_fortran" else "C")
    assert tensor.stride == ((1, 2) if key == "f64_fortran" else None)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_format_versions(version: tuple[int, int]) -> None:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ones((2, 3), np.float32), version=version)
    scan = scan_file(BytesSource(buf.getvalue(), name="w.npy"))
    assert [(t.dtype, t.shape) for t in scan.tensors] == [("F32", (2, 3))] and scan.findings == ()


def test_object_array_is_cg003_and_never_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "obj.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    scan = _scan(path)
    assert [f.code for f in scan.findings] == ["CG003"] and scan.tensors == ()


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["savez", "savez_compressed"])
def test_npz_reads_back_what_numpy_load_reports(tmp_path: Path, save: object) -> None:
    path = tmp_path / "weights.npz"
    arrays = {k: v for k, v in ARRAYS.items() if k != "bf16"}
    save(path, **arrays)  # type: ignore[operator]
    scan = _scan(path)
    assert scan.format == "npz" and scan.findings == ()
    with np.load(path) as npz:
        theirs = {k: (numpy_code(npz[k].dtype), npz[k].shape) for k in npz.files}
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == theirs
    compressed = save is np.savez_compressed
    assert scan.metadata["npz.compressed"] == str(compressed).lower()
    data = path.read_bytes()
    for tensor in scan.tensors:  # stored members are located, so --values can read them in place
        if compressed or tensor.name == "big_endian":
            assert tensor.data_start is None
        else:
            assert data[tensor.data_start:tensor.data_end] == arrays[tensor.name].tobytes(order="A")
    assert scan.bytes_read < 4096


def test_npz_is_not_taken_for_a_torch_zip(tmp_path: Path) -> None:
    path = tmp_path / "model.npz"
    np.savez(path, w=np.ones(2))
    assert _scan(path).format == "npz"
    renamed = path.rename(tmp_path / "model.bin")
    assert _scan(renamed).format is None  # a zip without data.pkl named .bin: CG001 as a torch zip


# ---------------------------------------------------------------- hostile files (hand-made)

def _npy(header: bytes, data: bytes = b"", version: int = 1) -> bytes:
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header + data


def _zip(members: dict[str, bytes], compress: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compress) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buf.getvalue()


def _overlapping_bomb() -> bytes:
    """Fifield's non-recursive zip bomb in miniature: many central entries, one local file."""
    member = _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }\n", b"\0" * 16)
    one = _zip({"a.npy": member})
    cd_at = one.index(b"PK\x01\x02")
    entry = one[cd_at:one.index(b"PK\x05\x06")]
    entries = [entry.replace(b"a.npy", f"{chr(97 + i)}.npy".encode()) for i in range(20)]
    directory = b"".join(entries)
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 20, 20, len(directory), cd_at, 0)
    return one[:cd_at] + directory + eocd


def _lying_size() -> bytes:
    data = _zip({"a.npy": _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000,), }\n",
                               b"\0" * 16)}, zipfile.ZIP_DEFLATED)
    return data


HOSTILE = {
    "overlapping-entries-bomb": (lambda: _overlapping_bomb(), "weights.npz", "overlaps"),
    "member-smaller-than-its-array": (_lying_size, "weights.npz", "less than"),
    "header-is-not-a-literal": (lambda: _npy(b"__import__('os').system('x')"), "w.npy", "literal"),
    "header-is-a-list": (lambda: _npy(b"[1, 2]"), "w.npy", "dict"),
    "header-over-10000": (lambda: _npy(b"{" + b" " * 20_000 + b"}", version=2), "w.npy", "10,000"),
    "nested-parentheses": (lambda: _npy(b"(" * 5000 + b")" * 5000), "w.npy", "literal"),
    "huge-integer": (lambda: _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (" + b"9" * 5000 + b",)}"),
                     "w.npy", "literal"),
    "shape-2^62-in-a-tiny-file": (lambda: _npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': (2**62,)}"),
                                  "w.npy", "literal"),
    "shape-10^12-in-a-tiny-file": (lambda: _npy(b"{'descr': '<f8', 'fortran_order': False, "
                                                b"'shape': (1000000, 1000000)}"), "w.npy", "past the end"),
    "negative-dim": (lambda: _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}"), "w.npy",
                     "non-negative"),
    "unknown-descr": (lambda: _npy(b"{'descr': '<f3', 'fortran_order': False, 'shape': (1,)}"), "w.npy",
                      "descr"),
    "version-4": (lambda: _npy(b"{}", version=4), "w.npy", "version"),
    "truncated-header": (lambda: _npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}")[:20],
                         "w.npy", "past the end"),
    "member-not-npy": (lambda: _zip({"a.npy": b"not an array"}), "weights.npz", "magic"),
    "deflate-garbage": (lambda: _zip({"a.npy": _npy(b"{}")}, zipfile.ZIP_DEFLATED).replace(
        b"\x93NUMPY", b"\xff" * 6), "weights.npz", ""),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_numpy_files_are_cg001_fast_and_small(case: str) -> None:
    build, name, contains = HOSTILE[case]
    assert_refused(build(), name, contains)


def test_a_big_deflated_member_is_read_only_for_its_header() -> None:
    array = np.zeros(8_000_000, np.float32)  # 32 MB of zeros: ~32 KB deflated
    buf = io.BytesIO()
    np.savez_compressed(buf, big=array)
    source = BytesSource(buf.getvalue(), name="weights.npz")
    scan = scan_file(source)
    assert [(t.name, t.dtype, t.shape) for t in scan.tensors] == [("big", "F32", (8_000_000,))]
    assert source.bytes_read < 24 * 1024


def test_python2_long_ints_in_a_v1_header_read_as_numpy_reads_them(tmp_path: Path) -> None:
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }"
    path = tmp_path / "old.npy"
    path.write_bytes(_npy(header, b"\0" * 24))
    with pytest.warns(UserWarning):
        theirs = np.load(path, mmap_mode="r")
    assert [(t.dtype, t.shape) for t in _scan(path).tensors] == [("F32", theirs.shape)]
    path.write_bytes(_npy(header, b"\0" * 24, version=3))  # 3.0 never had the second try
    assert _scan(path).format is None
