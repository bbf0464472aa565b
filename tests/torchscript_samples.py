"""TorchScript archives written by torch.jit, and torch.jit.load's verdict on any bytes (not a test module).

Shared by tests/test_torchscript_reader.py, the differential agreement test and
fuzz/make_corpus.py.  The reference is ``torch.jit.load`` in a forked worker (a
mutated archive may crash or hang the TorchScript deserializer): its
``state_dict()`` by name, plus every tensor constant of every submodule's code
(``code_with_constants``), deduplicated by storage as ``constants.pkl`` holds them.
"""

from __future__ import annotations

import functools
import io
import multiprocessing
from collections import Counter
from typing import Any

import torch

Listing = tuple[dict[str, tuple[str, tuple[int, ...]]], Counter]  # state_dict, constants (code, shape)
REFERENCE_SECONDS = 5.0
_POOL: Any = None


def code_of(dtype: torch.dtype) -> str:
    from guard.dtypes import TORCH_NAMES

    name = str(dtype).removeprefix("torch.")
    return TORCH_NAMES.get(name, name)


class Block(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 4).to(dtype)
        self.norm = torch.nn.BatchNorm1d(4).to(dtype)
        self.register_buffer("steps", torch.zeros(2, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.lin(x)) * torch.tensor([2.0, 3.0, 4.0, 5.0], dtype=x.dtype)


class Net(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.block = Block(dtype)
        self.head = torch.nn.Linear(4, 2).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x)) + torch.ones(2, dtype=x.dtype)


def save_bytes(module: Any, *, lite: bool = False) -> bytes:
    out = io.BytesIO()
    if lite:  # what .ptl files hold (torch.jit's mobile format: bytecode.pkl beside data.pkl)
        out.write(module._save_to_buffer_for_lite_interpreter())
    else:
        torch.jit.save(module, out)
    return out.getvalue()


def build(kind: str, dtype: torch.dtype = torch.float32) -> Any:
    """A ScriptModule: ``script``, ``trace`` (constants in constants/), ``frozen`` (weights as constants)."""
    torch.manual_seed(0)
    net = Net(dtype).eval()
    if kind == "script":
        return torch.jit.script(net)
    if kind == "trace":
        return torch.jit.trace(net, torch.zeros(2, 3, dtype=dtype))
    if kind == "frozen":
        return torch.jit.freeze(torch.jit.script(net))
    raise ValueError(kind)


def sample_torchscripts() -> list[bytes]:
    """Small, varied archives: the mutation bases and the fuzz seeds, the same bytes on every run.

    torch.jit writes a module's ``Final`` constants in the order of a Python set, so the code
    records (and every offset after them) follow the process's string-hash seed: the archives
    are written in a child process with ``PYTHONHASHSEED=0``, and their random serialization
    id is zeroed, so a seeded mutation sample is the same on every run and every machine.
    """
    import os

    if os.environ.get("PYTHONHASHSEED") != "0":
        return list(_written_with_fixed_hash_seed())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        archives = [save_bytes(build("script")), save_bytes(build("trace")), save_bytes(build("frozen")),
                    save_bytes(build("script", torch.bfloat16)), save_bytes(build("script"), lite=True)]
    return [fixed_serialization_id(data) for data in archives]


@functools.lru_cache(maxsize=1)
def _written_with_fixed_hash_seed() -> tuple[bytes, ...]:
    import os
    import pickle
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    script = ("import pickle, sys; sys.path.insert(0, sys.argv[1]); "
              "from torchscript_samples import sample_torchscripts; "
              "sys.stdout.buffer.write(pickle.dumps(sample_torchscripts()))")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, "-c", script, here], env=env, capture_output=True, check=True)
    return tuple(pickle.loads(done.stdout))  # our own child's output, not a checkpoint


def fixed_serialization_id(data: bytes) -> bytes:
    """The archive with ``.data/serialization_id`` set to zeros of the same length.

    torch.jit.save writes a random id there on every save, so a seeded mutation sample drawn
    from fresh archives would differ from run to run; torch.jit.load never checks the id.
    The record is stored, not deflated: its bytes and its CRC-32 (local header and central
    directory) are patched in place and the layout stays as torch wrote it.
    """
    import struct
    import zipfile
    import zlib

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = next((i for i in archive.infolist() if i.filename.endswith("/.data/serialization_id")), None)
        if info is None or info.compress_type != zipfile.ZIP_STORED:
            return data
        old = archive.read(info)
    new = b"0" * len(old)
    out = bytearray(data)
    name_len, extra_len = struct.unpack_from("<HH", out, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    out[start:start + len(old)] = new
    crc = struct.pack("<I", zlib.crc32(new))
    out[info.header_offset + 14:info.header_offset + 18] = crc
    central = out.find(b"PK\x01\x02", len(out) - 22 - 46 * 64)  # search the central directory for this entry
    needle = info.filename.encode()
    while central != -1:
        entry_name_len = struct.unpack_from("<H", out, central + 28)[0]
        if out[central + 46:central + 46 + entry_name_len] == needle:
            out[central + 16:central + 20] = crc
            break
        central = out.find(b"PK\x01\x02", central + 4)
    return bytes(out)


def listing(data: bytes) -> Listing | str:
    """torch.jit.load's tensors, in this process."""
    try:
        module = torch.jit.load(io.BytesIO(data), map_location="cpu")
        state = {name: (code_of(t.dtype), tuple(t.shape)) for name, t in module.state_dict().items()}
        constants: dict[tuple[int, str, tuple[int, ...]], None] = {}
        for sub in module.modules():
            for value in sub._c.code_with_constants[1].values():
                if isinstance(value, torch.Tensor):
                    constants[(value.data_ptr(), code_of(value.dtype), tuple(value.shape))] = None
    except Exception as exc:  # noqa: BLE001 - the reference's refusal is the datum we record
        return f"torch.jit.load: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return state, Counter((code, shape) for _ptr, code, shape in constants)


def reference_torchscript(data: bytes) -> Listing | str:
    """``listing`` in a forked worker, replaced when it crashes or takes too long."""
    global _POOL
    if _POOL is None:
        _POOL = multiprocessing.get_context("fork").Pool(1)
    try:
        return _POOL.apply_async(listing, (data,)).get(REFERENCE_SECONDS)  # type: ignore[no-any-return]
    except multiprocessing.TimeoutError:
        _POOL.terminate()
        _POOL = None
        return f"torch.jit.load: no answer after {REFERENCE_SECONDS:g} s (crashed or hung)"


def our_listing(tensors: Any) -> Listing:
    state = {t.name: (t.dtype, t.shape) for t in tensors if not t.name.startswith("constants.")}
    return state, Counter((t.dtype, t.shape) for t in tensors if t.name.startswith("constants."))
