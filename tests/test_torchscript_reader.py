"""TorchScript archives (torch.jit.script / trace / freeze + torch.jit.save, and the lite .ptl):
read as torch.jit.load reads them, judged by the dtype rules, hostile ones refused quickly."""

from __future__ import annotations

import io
import pickle
import struct
import warnings
import zipfile
from pathlib import Path

import pytest
from fuzz_inputs import assert_refused, assert_well_behaved, bounded_scan
from scanning import codes, json_scan

from guard.findings import Severity
from guard.readers import scan_file
from guard.sources import BytesSource, LocalFile

torch = pytest.importorskip("torch")
from torchscript_samples import build, listing, our_listing, save_bytes  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.filterwarnings("ignore", message=".*(Lite Interpreter|TracerWarning|torch.tensor results).*")


def _rezip(data: bytes, edit: dict[str, bytes]) -> bytes:
    """The archive with some records replaced (names keep their folder)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            short = item.filename.split("/", 1)[1]
            dst.writestr(item, edit.get(short, src.read(item)))
    return out.getvalue()


@pytest.mark.parametrize("kind", ["script", "trace", "frozen", "lite"])
@pytest.mark.parametrize("suffix", [".pt", ".pth", ".jit", ".ptl"])
def test_tensors_match_jit_load(tmp_path: Path, kind: str, suffix: str) -> None:
    data = save_bytes(build("script" if kind == "lite" else kind), lite=kind == "lite")
    path = tmp_path / f"model{suffix}"
    path.write_bytes(data)
    with LocalFile(path, name=path.name) as src:
        scan = scan_file(src)
    assert scan.format == "torchscript"
    assert our_listing(scan.tensors) == listing(data)
    if kind == "frozen":  # freezing folds the weights into constants: all of them are constants
        assert all(t.name.startswith("constants.") for t in scan.tensors) and len(scan.tensors) > 3
    # the __torch__ classes are one note, never a CG003 error
    assert [(f.code, f.severity) for f in scan.findings] == [("CG003", Severity.note)]
    assert "__torch__" in scan.findings[0].message


def test_tensor_attributes_are_read_too() -> None:
    class WithAttribute(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.tensor([1.5, 2.5], dtype=torch.float64)  # neither parameter nor buffer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale

    module = torch.jit.script(WithAttribute())
    scan = scan_file(BytesSource(save_bytes(module), name="model.pt"))
    loaded = torch.jit.load(io.BytesIO(save_bytes(module)))
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == {"scale": ("F64", tuple(loaded.scale.shape))}


def test_bf16_torchscript_is_cg101_and_fp32_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain, bf16 = tmp_path / "plain", tmp_path / "bf16"
    plain.mkdir()
    bf16.mkdir()
    for name, lite in (("model.pt", False), ("model.jit", False), ("model.ptl", True)):
        (plain / name).write_bytes(save_bytes(build("script"), lite=lite))
    (bf16 / "model.jit").write_bytes(save_bytes(build("script", torch.bfloat16)))
    code, report = json_scan(capsys, str(plain))
    # the note on the __torch__ classes; CG106 warns of the int64 buffers under JAX's defaults
    assert code == 0 and codes(report, severity="error") == set() and codes(report, severity="note") == {"CG003"}
    assert {Path(f["path"]).name for f in report["models"][0]["files"]} == {"model.pt", "model.jit", "model.ptl"}
    assert all(f["format"] == "torchscript" and f["tensors"] == 10 for f in report["models"][0]["files"])
    code, report = json_scan(capsys, str(bf16))
    assert code == 1 and "CG101" in codes(report, severity="error")


def test_values_scan_reads_parameters_and_constants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--values places data/ and constants/ storages: a NaN weight and a constant beyond fp16's range."""
    class WithConstant(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 4)
            with torch.no_grad():
                self.lin.weight[0, 0] = float("nan")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * torch.tensor([1e30, 2.0, 3.0, 4.0])

    torch.jit.save(torch.jit.trace(WithConstant(), torch.zeros(1, 3)), tmp_path / "model.jit")
    code, report = json_scan(capsys, "--values", "--target", "torch:fp16", str(tmp_path))
    found = {(f["code"], f["tensor"]) for f in report["findings"]}
    assert code == 1 and {("CG203", "lin.weight"), ("CG201", "constants.0")} <= found, found


def test_a_foreign_global_in_torchscript_stays_a_cg003_error() -> None:
    data = save_bytes(build("script"))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        original = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))
    hostile = _rezip(data, {"data.pkl": original.replace(b"collections\nOrderedDict\n", b"posix\nsystem\n")})
    scan = scan_file(BytesSource(hostile, name="model.pt"))
    errors = [f for f in scan.findings if f.severity == Severity.error]
    # the tensors were built through it (as their backward hooks): none is read, which is CG001 too
    assert [f.code for f in errors] == ["CG003", "CG001"] and "posix.system" in errors[0].message


def test_a_constant_moved_out_of_the_constants_folder_is_refused_outside_the_lite_format() -> None:
    """Only the lite format (bytecode.pkl, its shared storage context) keeps constants in data/, which
    test_tensors_match_jit_load[lite] reads; torch.jit.load of any other archive looks in constants/."""
    data = save_bytes(build("trace"))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        prefix = names[0].split("/", 1)[0]
        records = {n.split("/", 1)[1]: archive.read(n) for n in names}
    top = max(int(n.split("/")[1]) for n in records if n.startswith("data/"))
    moved, constants_pkl = {}, records["constants.pkl"]
    for name in [n for n in records if n.startswith("constants/")]:
        key = str(top + 1 + int(name.split("/")[1]))
        moved[f"data/{key}"] = records[name]
        constants_pkl = constants_pkl.replace(f"X\x01\x00\x00\x00{name.split('/')[1]}".encode(),
                                              f"X{struct.pack('<I', len(key)).decode()}{key}".encode())
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for name, body in records.items():
            if not name.startswith("constants/"):
                dst.writestr(f"{prefix}/{name}", constants_pkl if name == "constants.pkl" else body)
        for name, body in moved.items():
            dst.writestr(f"{prefix}/{name}", body)
    moved_out = out.getvalue()
    theirs = listing(moved_out)
    assert isinstance(theirs, str) and "constants/" in theirs
    scan = scan_file(BytesSource(moved_out, name="model.pt"))
    [finding] = [f for f in scan.findings if f.code == "CG001"]
    assert "'constants/" in finding.message


def test_remote_scan_reads_a_tiny_share(tmp_path: Path) -> None:
    module = torch.jit.script(torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]))
    data = save_bytes(module)
    scan = scan_file(_Remote(data))
    assert scan.format == "torchscript" and len(scan.tensors) == 16
    assert scan.bytes_read < 0.01 * len(data), (scan.bytes_read, len(data))


class _Remote:
    """Not a local file: the reader pays no local-header read per storage, as through HTTP ranges."""

    def __init__(self, data: bytes) -> None:
        self.data, self.size, self.name = data, len(data), "model.pt"

    def read_at(self, offset: int, size: int) -> bytes:
        return self.data[offset:offset + size]


# ------------------------------------------------------------------ bad input


class _Storage:
    pass


class _Tensor:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def __reduce__(self) -> tuple[object, ...]:
        from collections import OrderedDict

        return torch._utils._rebuild_tensor_v2, (_Storage(), 0, self.shape, (1,) * len(self.shape), False,
                                                 OrderedDict())


def _one_tensor_pickle(numel: int, shape: tuple[int, ...]) -> bytes:
    """data.pkl of ``{"w": tensor}`` over storage '0', by the stdlib pickler as torch uses it."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=2)
    pickler.persistent_id = lambda obj: (  # type: ignore[method-assign]
        ("storage", torch.FloatStorage, "0", "cpu", numel) if isinstance(obj, _Storage) else None)
    pickler.dump({"w": _Tensor(shape)})
    return out.getvalue()


def test_truncations_are_cg001_quickly() -> None:
    data = save_bytes(build("trace"))
    for cut in range(0, len(data) - 1, 97):
        result = bounded_scan(data[:cut], "model.pt")
        assert_well_behaved(result, data)
        assert result.scan.format is None, cut


def test_huge_counts_and_deep_nesting_are_cg001() -> None:
    data = save_bytes(build("script"))
    # a storage of 2^63 elements, and a tensor of 2^62 on a storage of 2
    assert_refused(_rezip(data, {"data.pkl": _one_tensor_pickle(2**63, (2,))}), "model.pt", "shorter than")
    assert_refused(_rezip(data, {"data.pkl": _one_tensor_pickle(2, (2**62,))}), "model.pt", "runs past")
    depth = 10_000
    deep = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    assert_refused(_rezip(data, {"data.pkl": deep}), "model.pt", "deep")
    assert_refused(_rezip(data, {"constants.pkl": deep}), "model.pt", "deep")


def _data_pkl(data: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))


@pytest.mark.parametrize("case", ["protocol-4", "class-name-space", "class-name-nul"])
def test_records_torch_jit_load_refuses_are_refused(case: str) -> None:
    """Three verdicts held to torch.jit.load's own unpickler (docs/reliability.md, TorchScript)."""
    data = save_bytes(build("script"))
    pkl = _data_pkl(data)
    if case == "protocol-4":
        assert pkl[:2] == b"\x80\x02"
        pkl = b"\x80\x04" + pkl[2:]
    else:
        bad = b" " if case == "class-name-space" else b"\x00"
        assert b"__torch__.torchscript_samples\nNet\n" in pkl
        pkl = pkl.replace(b"__torch__.torchscript_samples\nNet\n",
                          b"__torch__.torchscript_samples\nN" + bad + b"t\n", 1)
    mutant = _rezip(data, {"data.pkl": pkl})
    theirs = listing(mutant)
    assert isinstance(theirs, str), theirs  # the reference refuses it
    if case == "protocol-4":
        assert "Only Pickle protocol 2" in theirs
    result = bounded_scan(mutant, "model.pt")
    assert_well_behaved(result, mutant)
    assert "CG001" in {f.code for f in result.scan.findings}, result.scan.findings
    assert ("protocol 4" if case == "protocol-4" else "class name") in result.reason


def test_zip64_end_record_running_into_its_locator_is_read_as_torch_reads_it() -> None:
    """miniz reads the zip64 end record where the locator points, even over the locator itself."""
    data = bytearray(save_bytes(build("script")))
    loc = data.rfind(b"PK\x06\x07")
    record = struct.unpack_from("<Q", data, loc + 8)[0]
    assert data[record:record + 4] == b"PK\x06\x06" and record + 56 == loc
    moved = record + 12  # the record now overlaps the locator; its counts become garbage
    struct.pack_into("<Q", data, loc + 8, moved)
    data[moved:moved + 4] = b"PK\x06\x06"
    mutant = bytes(data)
    assert isinstance(listing(mutant), str)  # torch.jit.load refuses it
    result = bounded_scan(mutant, "model.pt")
    assert_well_behaved(result, mutant)
    assert "CG001" in {f.code for f in result.scan.findings}, result.scan.findings
