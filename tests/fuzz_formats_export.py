"""torch.export ``.pt2`` for the fuzz machinery of ``fuzz_inputs``: samples, the reference, known cases.

Not a test module.  Samples are written by ``torch.export.save``; the reference is
``torch.export.load`` (its ``state_dict`` plus tensor ``constants``), run in the
forked worker ``fuzz_inputs`` keeps for C readers, so a crash or a hang in
torch's archive reader is the reference's refusal, not the suite's.  When the
whole load fails, the weights are loaded alone (the configs, their records and
the sample inputs, as ``load_pt2`` reads them): if that succeeds, the refusal was
the graph's (``models/model.json``), which a header scan does not parse.
"""

from __future__ import annotations

import io
import re
import struct
from collections.abc import Callable
from typing import Any

Inventory = dict[str, tuple[str, tuple[int, ...]]]

FILE_NAMES_EXPORT = {"torch-export": "model.pt2"}
REFERENCE_SECONDS = 30.0
PROGRAM_REFUSED = "torch.export.load (program only)"
FOLDER_RECORD = "torch.export.load (a record marked as a folder)"


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _inventory(state_dict: dict[str, Any], constants: dict[str, Any]) -> Inventory:
    import torch
    from fuzz_inputs import torch_code

    tensors = {**state_dict, **{k: v for k, v in constants.items() if isinstance(v, torch.Tensor)}}
    return {name: (torch_code(t), tuple(t.shape)) for name, t in tensors.items()}


def _weights_alone(data: bytes) -> Inventory:
    from torch._export.serde.serialize import deserialize_torch_artifact
    from torch.export.pt2_archive._package import PT2ArchiveReader, _load_constants, _load_state_dict

    with PT2ArchiveReader(io.BytesIO(data)) as reader:
        deserialize_torch_artifact(reader.read_bytes("data/sample_inputs/model.pt"))
        state_dict, constants = _load_state_dict(reader, "model"), _load_constants(reader, "model")
    if not isinstance(state_dict, dict) or not isinstance(constants, dict):
        raise ValueError("legacy weights")
    return _inventory(state_dict, constants)


def _pt2_listing(data: bytes) -> Inventory | str:
    import logging

    import torch

    logging.disable(logging.CRITICAL)
    try:
        program = torch.export.load(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - the reference's refusal is the datum we record
        reason = f"torch.export.load: {_first_line(exc)}"
    else:
        return _inventory(program.state_dict, program.constants)
    if _has_folder_records(data):
        return f"{FOLDER_RECORD}: {reason}"
    try:
        _weights_alone(data)
    except Exception:  # noqa: BLE001
        return reason
    return f"{PROGRAM_REFUSED}: {reason}"


def _has_folder_records(data: bytes, depth: int = 0) -> bool:
    """A record whose directory entry carries the DOS folder attribute (0x10), in the archive or in a
    torch.save file inside it: miniz takes it for a folder and hands torch uninitialised bytes for it."""
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            if any(info.external_attr & 0x10 for info in infos):
                return True
            return depth == 0 and any(_has_folder_records(_stored_bytes(archive, data, info), 1) for info in infos
                                      if info.filename.endswith(".pt"))
    except Exception:  # noqa: BLE001 - not a zip that zipfile reads: nothing to say
        return False


def _stored_bytes(archive: Any, data: bytes, info: Any) -> bytes:
    """A stored member's bytes as they lie in ``data``, without zipfile's CRC check: a mutant that
    changed a nested torch.save file (its CRC then fails) can still be one whose records are marked
    as folders.  A deflated member (torch writes none) is read through zipfile."""
    if info.compress_type != 0:
        return archive.read(info)
    name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
    start = info.header_offset + 30 + name_length + extra_length
    return data[start:start + info.compress_size]


def reference_pt2(data: bytes) -> Inventory | str:
    from fuzz_inputs import _in_pool

    # a fresh worker imports torch.export on its first load: seconds, not the milliseconds of a load
    return _in_pool(_pt2_listing, data, seconds=REFERENCE_SECONDS,
                    library="torch.export.load: no answer after {seconds:g} s")


def _pt2_samples() -> list[bytes]:
    """Three exports of one small block, the same bytes on every machine and every run.

    torch.export.save writes each node's ``stack_trace`` into models/model.json: absolute paths
    (this file's, torch's in the venv) and line numbers, so the bytes, and with them the seeded
    mutants, changed with the checkout, the venv and any edit above ``forward``.  The traces are
    dropped before saving (the program torch.export.save then writes loads the same); the
    class's name in ``nn_module_stack`` is fixed, whatever name this module was imported under.
    """
    import torch

    class Block(torch.nn.Module):
        __module__, __qualname__ = "fuzz_formats_export", "Block"

        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(5, 4)
            self.proj = torch.nn.Linear(4, 5, bias=False)
            self.proj.weight = self.embed.weight
            self.register_buffer("mask", torch.tensor([True, False, True, True]))
            self.register_buffer("hidden", torch.ones(2, dtype=torch.float64), persistent=False)
            self.ids = torch.arange(3, dtype=torch.int32)

        def forward(self, ids: Any) -> Any:
            x = self.embed(ids) * self.mask + self.hidden.sum().to(self.embed.weight.dtype) + self.ids.sum()
            return self.proj(x)

    out = []
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        buffer = io.BytesIO()
        program = torch.export.export(Block().to(dtype), (torch.tensor([[1, 2]]),))
        for node in program.graph.nodes:
            node.meta.pop("stack_trace", None)
        torch.export.save(program, buffer)
        out.append(buffer.getvalue())
    return out


def _pte_samples() -> list[bytes]:
    """ExecuTorch programs (seeds for the atheris target; executorch's reader is not a differential reference:
    its Python flatbuffers code verifies nothing)."""
    import torch
    from executorch.exir import to_edge

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 3)
            self.register_buffer("ids", torch.arange(3))

        def forward(self, x: Any) -> Any:
            return self.proj(x) + self.ids

    out = []
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        program = torch.export.export(Small().to(dtype), (torch.ones(2, 4, dtype=dtype),))
        out.append(to_edge(program).to_executorch().buffer)
    return out


SAMPLERS_EXPORT: dict[str, Callable[[], list[bytes]]] = {"torch-export": _pt2_samples, "executorch": _pte_samples}

_EXPORT = ("torch-export",)
# (category, formats, we accept, pattern): Known records of fuzz_inputs; docs/reliability.md explains each
KNOWN_EXPORT: tuple[tuple[str, tuple[str, ...], bool, str], ...] = (
    # The graph (models/model.json) is not parsed: a scan reads the weights and constants configs only.
    ("program-not-read", _EXPORT, True, "^" + re.escape(PROGRAM_REFUSED)),
    # miniz returns uninitialised memory for a record whose directory entry has the DOS folder attribute
    # (torch then fails at random); we read the record as the file its name and sizes describe.
    ("folder-attribute", _EXPORT, True, "^" + re.escape(FOLDER_RECORD)),
    # The configs are read whole and their CRC-32 checked (torch does not check CRCs): a flipped digit
    # in a dtype code or a size is a corrupted file, not another model.
    ("crc-checked", _EXPORT, False, r"does not match its CRC-32"),
    # miniz, behind torch's archive reader, tolerates records that disagree; the zip directory is
    # read by the torch zip's rules (guard.readers.binary.zipdir), and torch.export.load then also tries zipfile.
    # A record torch finds only under another case (miniz ignores case) is refused, as a torch zip's storages are.
    ("stricter-zip", _EXPORT, False,
     r"zip does not hold|multi-disk|zip64|End Of Central Directory|does not fit|inconsistent sizes|overlaps"
     r"|differ only in case"),
)
REFERENCES_EXPORT: dict[str, Callable[[bytes], Inventory | str]] = {"torch-export": reference_pt2}
