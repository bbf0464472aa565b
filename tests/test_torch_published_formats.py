"""The torch files people publish: 2018-era legacy pickles, TorchScript archives, whole pickled modules.

Legacy files come from real ``torch.save(..., _use_new_zipfile_serialization=False)``
(default protocol and ``pickle_protocol=2``) and from ``torch04`` (written as torch 0.4
wrote them: six-element storage ids with views, ``cuda:0``, Windows ``type_sizes``,
Python 2's SHORT_BINSTRING / LONG1 / list-pair OrderedDict).  Each is judged against the
reference ``torch.load(f, weights_only=True, map_location="cpu")``; TorchScript archives
(``torch.jit.script`` / ``trace`` + ``torch.jit.save``) against ``torch.jit.load``'s
``state_dict()`` plus its constants.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fuzz_inputs import assert_refused, assert_well_behaved, bounded_scan
from scanning import codes, json_scan
from torch04 import (
    LINUX_SIZES,
    WINDOWS_SIZES,
    Module,
    ModuleClass,
    Storage,
    Tensor,
    f32,
    save_legacy,
    state_dict_04,
    tensor,
)

from guard.readers import scan_file
from guard.sources import BytesSource, LocalFile
from guard.tensors import FileScan

torch = pytest.importorskip("torch")

CODES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
         torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.int8: "I8", torch.bool: "BOOL"}


def _scan(path: Path) -> FileScan:
    with LocalFile(path, name=path.name) as src:
        return scan_file(src)


def _assert_matches_torch_load(data: bytes, scan: FileScan) -> None:
    """Names, dtypes, shapes, strides, shared storages and the bytes at each tensor's offsets."""
    loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    ours = {t.name: t for t in scan.tensors}
    assert set(ours) == set(loaded)
    for name, ref in loaded.items():
        info = ours[name]
        assert (info.dtype, info.shape) == (CODES[ref.dtype], tuple(ref.shape)), name
        assert info.stride == (None if ref.is_contiguous() else tuple(ref.stride())), name
        assert info.data_start is not None and info.data_end is not None
        if ref.is_contiguous():
            assert data[info.data_start:info.data_end] == ref.numpy().tobytes(), name
    # tied weights and views: the same root storage exactly when torch's tensors share memory, at the
    # same distance apart in memory as in the file
    for a, ref_a in loaded.items():
        for b, ref_b in loaded.items():
            if ours[a].storage == ours[b].storage:
                assert ref_a.data_ptr() - ref_b.data_ptr() == ours[a].data_start - ours[b].data_start, (a, b)
            else:
                assert ref_a.untyped_storage().data_ptr() != ref_b.untyped_storage().data_ptr(), (a, b)


def _opcodes(data: bytes) -> set[str]:
    stream, names = io.BytesIO(data), set()
    for _ in range(5):  # magic, protocol, sys_info, the object, the keys
        names |= {op.name for op, _arg, _pos in pickletools.genops(stream)}
    return names


# ------------------------------------------------------------------ legacy pickles


@pytest.mark.parametrize("python2", [True, False], ids=["python2", "python3"])
@pytest.mark.parametrize("type_sizes", [LINUX_SIZES, WINDOWS_SIZES], ids=["linux", "windows"])
@pytest.mark.parametrize("location", ["cpu", "cuda:0"])
def test_torch04_files_read_as_torch_load_reads_them(python2: bool, type_sizes: dict[str, int],
                                                     location: str) -> None:
    data = save_legacy(state_dict_04(location), python2=python2, type_sizes=type_sizes)
    if python2:  # the file really is what cPickle wrote under Python 2
        assert {"SHORT_BINSTRING", "LONG1", "GLOBAL", "BINPERSID"} <= _opcodes(data)
    scan = scan_file(BytesSource(data, name="model.pth"))
    assert scan.format == "torch-legacy" and scan.findings == ()
    _assert_matches_torch_load(data, scan)


@pytest.mark.parametrize("protocol", [2, 3])  # torch's default, and the newest weights_only loads
def test_real_legacy_saves_match_torch_load(tmp_path: Path, protocol: int) -> None:
    base = torch.arange(12, dtype=torch.float32)
    state = {"w": base.view(3, 4), "t": base.view(3, 4).T, "row": base[4:8], "h": torch.ones(2, dtype=torch.float16),
             "ids": torch.arange(3), "nested": OrderedDict(x=torch.zeros(2, dtype=torch.bfloat16))}
    path = tmp_path / "model.pth"
    torch.save(state, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    scan = _scan(path)
    assert scan.format == "torch-legacy" and scan.findings == ()
    loaded = torch.load(path, weights_only=True)
    flat = {"w": loaded["w"], "t": loaded["t"], "row": loaded["row"], "h": loaded["h"], "ids": loaded["ids"],
            "nested.x": loaded["nested"]["x"]}
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == {
        k: (CODES[v.dtype], tuple(v.shape)) for k, v in flat.items()}


def test_2018_pth_is_counted_in_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: a torch 0.4 / Python 2 .pth on cuda:0 read 0 tensors and passed in silence."""
    (tmp_path / "net.pth").write_bytes(save_legacy(state_dict_04("cuda:0", half=False), python2=True))
    code, report = json_scan(capsys, str(tmp_path))
    assert code == 0 and codes(report) == set()
    dtypes = report["models"][0]["dtypes"]  # the tied head.weight counted once
    assert (dtypes["F32"]["parameters"], dtypes["I64"]["parameters"]) == (12 + 3 + 4 + 2, 1)
    (tmp_path / "net.pth").write_bytes(save_legacy(state_dict_04("cuda:0"), python2=True))
    code, report = json_scan(capsys, str(tmp_path))
    assert code == 1 and "CG101" in codes(report)  # its fp16 tensor, under the default expect fp32


def test_torch04_whole_module_lists_its_tensors_and_names_its_classes() -> None:
    """torch.save(model) under 0.4: ('module', class, file, source) ids, then the module's __dict__."""
    linear = ModuleClass("torch.nn.modules.linear", "Linear")
    fc = Module(linear, {"training": True, "_buffers": OrderedDict(), "_modules": OrderedDict(),
                         "_parameters": OrderedDict([
                             ("weight", tensor("Float", f32(*range(6)), (2, 3), key="1")),
                             ("bias", tensor("Float", f32(0, 1), (2,), key="2"))])})
    net = Module(ModuleClass("__main__", "Net"), {"training": True, "_parameters": OrderedDict(),
                                                  "_buffers": OrderedDict(), "_modules": OrderedDict(fc=fc)})
    data = save_legacy(net, python2=True)
    with pytest.raises(pickle.UnpicklingError):  # the reference refuses what it would have to build
        torch.load(io.BytesIO(data), weights_only=True)
    scan = scan_file(BytesSource(data, name="model.pth"))
    assert {t.name: t.shape for t in scan.tensors} == {"fc.weight": (2, 3), "fc.bias": (2,)}
    assert [f.code for f in scan.findings] == ["CG003", "CG003"]
    assert "__main__.Net" in scan.findings[0].message


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 4)
        self.block = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))
        self.register_buffer("scratch", torch.ones(5), persistent=False)  # not in state_dict()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.fc(x))


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_pickled_module_tensors_are_in_the_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     zipped: bool) -> None:
    model = _Net()
    torch.save(model, tmp_path / "model.pt", _use_new_zipfile_serialization=zipped)
    scan = _scan(tmp_path / "model.pt")
    state = model.state_dict()
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == {
        k: (CODES[v.dtype], tuple(v.shape)) for k, v in state.items()}
    code, report = json_scan(capsys, str(tmp_path))
    assert code == 1 and codes(report) == {"CG003"}
    by_dtype = report["models"][0]["dtypes"]  # every tensor, integer buffers too
    assert sum(row["parameters"] for row in by_dtype.values()) == sum(v.numel() for v in state.values())


def test_storages_with_no_tensor_read_are_a_finding(tmp_path: Path) -> None:
    """Never silent: storages that only an unknown rebuild function turns into tensors."""
    hidden = Tensor(Storage("Float", f32(1, 2), "cpu", "5"), 0, (2,), (1,))
    data = save_legacy({"w": hidden}, python2=False)
    data = data.replace(b"torch._utils\n_rebuild_tensor_v2\n", b"mylib.tensors\nrebuild_tensor\n")
    scan = scan_file(BytesSource(data, name="model.pth"))
    assert scan.tensors == () and [f.code for f in scan.findings] == ["CG003", "CG001"]
    assert "1 storage(s) but no tensor" in scan.findings[1].message
    # the same in a zip
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    with zipfile.ZipFile(tmp_path / "a.pt") as src, zipfile.ZipFile(tmp_path / "b.pt", "w") as dst:
        for item in src.infolist():
            body = src.read(item)
            if item.filename.endswith("data.pkl"):
                body = body.replace(b"torch._utils\n_rebuild_tensor_v2\n", b"mylib.tensors\nrebuild_tensor\n")
            dst.writestr(item, body)
    scan = _scan(tmp_path / "b.pt")
    assert scan.tensors == () and [f.code for f in scan.findings] == ["CG003", "CG001"]


# ------------------------------------------------------------------ legacy bad input


def test_legacy_truncations_are_cg001_quickly() -> None:
    data = save_legacy(state_dict_04("cuda:0"), python2=True)
    for cut in range(0, len(data) - 1, 7):
        result = bounded_scan(data[:cut], "model.pth")
        assert_well_behaved(result, data)
        assert result.scan.format is None, cut


def test_legacy_huge_counts_are_cg001() -> None:
    state = OrderedDict(w=tensor("Float", f32(1, 2), (2,), key="1"))
    data = save_legacy(state)
    # the storage's count header says 2^63 - 1 elements
    assert_refused(data[:-16] + struct.pack("<q", 2**63 - 1) + data[-8:], "model.pth", "")
    # the persistent id says 2^63 elements (LONG1), the tensor claims a 2^62-element shape
    huge = save_legacy(OrderedDict(w=Tensor(Storage("Float", f32(1, 2), "cpu", "1"), 0, (2**62,), (1,))))
    assert_refused(huge, "model.pth", "runs past")


def test_legacy_deep_nesting_is_cg001() -> None:
    depth = 10_000  # lists in lists, EMPTY_LIST ... APPEND: no MARK, no recursion in the walker
    deep = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    assert_refused(save_legacy(None, object_pickle=deep), "model.pth", "deep")


# ------------------------------------------------------------------ remote (hub scan)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    from hub_standin import standin_fixture

    yield from standin_fixture(monkeypatch, tmp_path)


def test_hub_scan_gives_the_local_verdicts(standin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2018 .pth, a whole pickled module and a bf16 TorchScript .jit: the same findings remotely."""
    from test_hub_scan import finding_keys, local_and_remote
    from torchscript_samples import build, save_bytes

    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "net.pth").write_bytes(save_legacy(state_dict_04("cuda:0"), python2=True))
    (folder / "scripted.jit").write_bytes(save_bytes(build("script", torch.bfloat16)))
    torch.save(_Net(), folder / "whole.pt")
    rc_local, local, rc_remote, remote = local_and_remote(standin, folder, "org/published", monkeypatch)
    assert rc_local == rc_remote == 1
    keys = finding_keys(local, "published")
    assert keys == finding_keys(remote, "org/published") and {"CG003", "CG101"} <= {k[0] for k in keys}
    assert local["models"][0]["dtypes"] == remote["models"][0]["dtypes"]
    assert {f["format"] for f in remote["models"][0]["files"]} == {"torch-legacy", "torchscript", "torch-zip"}
