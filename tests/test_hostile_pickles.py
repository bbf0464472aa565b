"""Hostile pickles: every one is CG003 naming the global, and nothing runs or is imported."""

from __future__ import annotations

import io
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from guard.readers import scan_file
from guard.sources import BytesSource, LocalFile

MODULE = "ckpt_guard_payload_mod"


@pytest.fixture
def sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module whose import, or whose ``boom`` call, creates the sentinel file."""
    target = tmp_path / "SENTINEL"
    (tmp_path / f"{MODULE}.py").write_text(
        f"open({str(target)!r}, 'w').close()\ndef boom(*a):\n    open({str(target)!r}, 'w').close()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield target
    assert not target.exists(), "the payload ran"
    assert MODULE not in sys.modules, "the payload module was imported"


def _zip(data_pkl: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", data_pkl)
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


def _legacy(obj_pkl: bytes, *, sys_info: bytes | None = None) -> bytes:
    return b"".join([
        pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2), pickle.dumps(1001, protocol=2),
        sys_info or pickle.dumps({"little_endian": True}, protocol=2), obj_pkl,
        pickle.dumps([], protocol=2),
    ])


CONTAINERS = {"zip": _zip, "legacy": _legacy}


def _unsafe_names(data: bytes) -> list[str]:
    scan = scan_file(BytesSource(data, name="evil.bin"))
    return [f.message.split()[2].rstrip(",") for f in scan.findings if f.code == "CG003"]


class _Reduce:
    def __init__(self, func: object, args: tuple[object, ...]) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.func, self.args


def _touch_cmd(sentinel: Path) -> str:
    return f"touch {sentinel}"


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("protocol", range(6))
def test_reduce_payloads_every_protocol(sentinel: Path, container: str, protocol: int) -> None:
    payloads = {
        "posix.system": _Reduce(os.system, (_touch_cmd(sentinel),)),
        "builtins.eval": _Reduce(eval, (f"open({str(sentinel)!r}, 'w')",)),
        "builtins.exec": _Reduce(exec, (f"open({str(sentinel)!r}, 'w')",)),
        "subprocess.Popen": _Reduce(subprocess.Popen, (["touch", str(sentinel)],)),
    }
    for dotted, payload in payloads.items():
        data = CONTAINERS[container](pickle.dumps({"w": 1, "x": payload}, protocol=protocol))
        assert _unsafe_names(data) == [dotted], (dotted, protocol)


HANDMADE = {
    "GLOBAL+REDUCE": (b"cos\nsystem\n(S'touch SENTINEL'\ntR.", ["os.system"]),
    "INST": (b"(S'touch SENTINEL'\nios\nsystem\n.", ["os.system"]),
    "OBJ": (b"(cos\nsystem\nS'touch SENTINEL'\no.", ["os.system"]),
    "NEWOBJ": (b"\x80\x02cos\nsystem\nX\x0e\x00\x00\x00touch SENTINEL\x85\x81.", ["os.system"]),
    "NEWOBJ_EX": (b"\x80\x04\x8c\x02os\x8c\x06system\x93X\x01\x00\x00\x00x\x85}\x92.", ["os.system"]),
    "STACK_GLOBAL": (b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x8c\x0etouch SENTINEL\x85R.",
                     ["os.system"]),
    "memoised STACK_GLOBAL names": (b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94h\x00h\x01\x93.",
                                    ["os.system"]),
    "python2 builtins": (b"c__builtin__\neval\n(S'1'\ntR.", ["builtins.eval"]),
    "getattr trick": (b"cbuiltins\ngetattr\n(c__builtin__\n__import__\n(S'os'\ntRS'system'\ntR"
                      b"(S'touch SENTINEL'\ntR.", ["builtins.getattr", "builtins.__import__"]),
    "__reduce_ex__ reconstructor": (b"ccopy_reg\n_reconstructor\n(cos\nsystem\nc__builtin__\nobject\nNtR.",
                                    ["copyreg._reconstructor", "os.system", "builtins.object"]),
    "same global twice is one finding": (b"(cos\nsystem\ncos\nsystem\nl.", ["os.system"]),
    "extension registry": (b"\x80\x02\x82\x01)R.", ["copyreg"]),
    "payload module": (f"c{MODULE}\nboom\n(tR.".encode(), [f"{MODULE}.boom"]),
    "look-alike module": (b"ctorch._utils_evil\n_rebuild_tensor_v2\n(tR.", ["torch._utils_evil._rebuild_tensor_v2"]),
    "look-alike package": (b"ctorchx._utils\n_rebuild_tensor_v2\n(tR.", ["torchx._utils._rebuild_tensor_v2"]),
    "look-alike name": (b"ctorch._utils\n_rebuild_tensor_v4\n(tR.", ["torch._utils._rebuild_tensor_v4"]),
    "torch attribute that is not a dtype": (b"ctorch\nload\n(S'x'\ntR.", ["torch.load"]),
    "frozenset is not allowed": (b"c__builtin__\nfrozenset\n)R.", ["builtins.frozenset"]),
}


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("case", HANDMADE)
def test_handmade_opcodes(sentinel: Path, container: str, case: str) -> None:
    body, expected = HANDMADE[case]
    names = _unsafe_names(CONTAINERS[container](body))
    if case == "extension registry":
        assert len(names) == 1 and names[0] == "copyreg"
    else:
        assert names == expected


def _storage_pid(cls: bytes) -> bytes:
    return (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage" + cls
            + b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00K\x04\x85K\x01\x85\x89)tR.")


@pytest.mark.parametrize("container", CONTAINERS)
def test_global_hidden_in_a_persistent_id_or_dtype(sentinel: Path, container: str) -> None:
    wrap = CONTAINERS[container]
    assert _unsafe_names(wrap(_storage_pid(b"cos\nsystem\n"))) == ["os.system"]
    assert _unsafe_names(wrap(_storage_pid(f"c{MODULE}\nboom\n".encode()))) == [f"{MODULE}.boom"]
    v3 = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v3\n((X\x07\x00\x00\x00storage"
          b"ctorch.storage\nUntypedStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ"
          b"K\x00K\x04\x85K\x01\x85\x89)cos\nsystem\ntR.")
    assert _unsafe_names(wrap(v3)) == ["os.system"]


def test_global_hidden_in_legacy_sys_info(sentinel: Path) -> None:
    sys_info = b"\x80\x02}X\x01\x00\x00\x00xcos\nsystem\nX\x01\x00\x00\x00x\x85Rs."
    assert _unsafe_names(_legacy(pickle.dumps({}, protocol=2), sys_info=sys_info)) == ["os.system"]


@pytest.mark.parametrize("new_zip", [True, False])
def test_real_checkpoint_with_payload_lists_tensors_and_agrees_with_torch(
    sentinel: Path, tmp_path: Path, new_zip: bool
) -> None:
    path = tmp_path / "model.bin"
    torch.save({"w": torch.ones(2, 3), "x": _Reduce(os.system, (_touch_cmd(sentinel),))}, path,
               _use_new_zipfile_serialization=new_zip)
    with LocalFile(path) as src:
        scan = scan_file(src)
    assert [f.code for f in scan.findings] == ["CG003"] and "posix.system" in scan.findings[0].message
    assert [(t.name, t.dtype, t.shape) for t in scan.tensors] == [("w", "F32", (2, 3))]
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)


def test_unsafe_and_malformed_keeps_both_verdicts(sentinel: Path) -> None:
    body = b"\x80\x02cos\nsystem\nh\x09."  # unsafe global, then a memo read of a missing slot
    scan = scan_file(BytesSource(_zip(body), name="evil.bin"))
    assert [f.code for f in scan.findings] == ["CG003", "CG001"]
    assert scan.format == "torch-zip"


def test_payload_bytes_are_never_a_length(sentinel: Path) -> None:
    huge = b"\x80\x02cos\nsystem\n\x8e" + struct.pack("<Q", 2**40) + b"."
    scan = scan_file(BytesSource(_zip(huge), name="evil.bin"))
    assert [f.code for f in scan.findings] == ["CG003", "CG001"]
