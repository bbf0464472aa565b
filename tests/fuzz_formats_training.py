"""Training checkpoints for the fuzz machinery: DCP ``.metadata`` and DeepSpeed ZeRO rank files.

Not a test module.  These are directory layouts, not one file ``scan_file`` reads, so they have their
own samples, reference and verdict here (tests/test_fuzz_training.py uses them, fuzz/make_corpus.py
writes their seeds, fuzz/fuzz_dcp_metadata.py and fuzz/fuzz_zero_states.py are their atheris targets):

* ``dcp_metadata_samples``: ``.metadata`` files ``torch.distributed.checkpoint.save`` writes for a few
  state dicts (nested model and optimizer, bf16, BYTE_IO items, a scalar, an empty tensor).
* ``reference_dcp_metadata``: torch's own classes build the ``Metadata`` (what ``FileSystemReader.
  read_metadata`` does with ``pickle.load``), except that ``find_class`` resolves only the globals a DCP
  ``.metadata`` holds: a mutant naming anything else is refused instead of imported or called (ours
  says CG003 for it: both refuse).  Its inventory is each item's dtype, shape and chunks, and each
  storage entry's file and byte range.
* ``dcp_verdict``: ours (``parse_metadata``) against the reference: "agree", a ``KNOWN_TRAINING``
  category (docs/reliability.md explains each), or "UNEXPLAINED".
"""

from __future__ import annotations

import io
import pickle
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

from fuzz_inputs import Known

DcpInventory = tuple[dict[str, Any], dict[Any, tuple[str, int, int]]]

KNOWN_TRAINING: tuple[Known, ...] = (
    # pickle's C reader checks each FRAME's length against the bytes left; the walker reads opcodes and
    # stops at STOP, so a frame cut short after the last opcode it needs is read
    Known("frames-not-checked", ("dcp-metadata",), True, r"pickle data was truncated"),
    # Metadata(storage_data=None) builds, and nothing can then locate a chunk (load fails on the first read):
    # we refuse it at once, as CG001
    Known("stricter-metadata", ("dcp-metadata",), False, r"storage_data is NoneType"),
)


def dcp_metadata_samples() -> list[bytes]:
    import torch
    import torch.distributed.checkpoint as dcp

    states: list[dict[str, Any]] = [
        {"model": {"w": torch.ones(4, 3), "b": torch.zeros(3)}, "step": io.BytesIO(b"7")},
        {"model": {"layers.0.w": torch.ones(2, 2, dtype=torch.bfloat16), "norm": torch.ones(2)},
         "optim": {"state": {"layers.0.w": {"exp_avg": torch.zeros(2, 2), "step": torch.tensor(3.0)}},
                   "param_groups": [{"lr": 0.1, "params": ["layers.0.w"]}]}},
        {"tok_embeddings.weight": torch.zeros(5, 2, dtype=torch.float16), "empty": torch.zeros(0, 3),
         "ids": torch.arange(4), "train_state": io.BytesIO(b"step=3")},
    ]
    samples = []
    for state in states:
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(state, storage_writer=dcp.FileSystemWriter(folder))
            samples.append((Path(folder) / ".metadata").read_bytes())
    return samples


def _allowed(module: str, name: str) -> bool:
    import torch

    from guard.training.registry import DCP_METADATA

    dotted = f"{module}.{name}"
    if dotted in DCP_METADATA.records or dotted in DCP_METADATA.values:
        return True
    return module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format))


class _DcpUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise pickle.UnpicklingError(f"global {module}.{name} is not one a DCP .metadata holds")
        return super().find_class(module, name)


_POOL: Any = None
REFERENCE_SECONDS = 5.0
REFERENCE_HEADROOM = 1 << 30  # pickle.load of a mutated length can ask for gigabytes: the worker may not


def _limit_memory() -> None:
    import resource

    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = size + REFERENCE_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def reference_dcp_metadata(data: bytes) -> DcpInventory | str:
    """The reference in a forked worker with a memory limit (replaced after a hang): pickle.load is C and
    allocates what a mutated length says; that is the reference's refusal, never the test's crash."""
    import multiprocessing

    global _POOL
    if _POOL is None:
        _POOL = multiprocessing.get_context("fork").Pool(1, initializer=_limit_memory)
    try:
        return _POOL.apply_async(_reference_dcp_metadata, (data,)).get(REFERENCE_SECONDS)  # type: ignore[no-any-return]
    except multiprocessing.TimeoutError:
        _POOL.terminate()
        _POOL = None
        return f"pickle.load: no answer after {REFERENCE_SECONDS:g} s"


def _reference_dcp_metadata(data: bytes) -> DcpInventory | str:
    """torch's Metadata of ``data``, as an inventory, or why it could not be built."""
    import torch
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata

    codes = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL"}
    try:
        meta = _DcpUnpickler(io.BytesIO(data)).load()
        if not isinstance(meta, Metadata) or not isinstance(meta.state_dict_metadata, dict):
            return f"not a Metadata: {type(meta).__name__}"
        items: dict[str, Any] = {}
        for fqn, value in meta.state_dict_metadata.items():
            if isinstance(value, BytesStorageMetadata):
                items[str(fqn)] = None
            elif isinstance(value, TensorStorageMetadata):
                code = codes.get(value.properties.dtype, str(value.properties.dtype))
                items[str(fqn)] = (code, tuple(int(d) for d in value.size),
                                   tuple((tuple(c.offsets), tuple(c.sizes)) for c in value.chunks))
            else:
                return f"item {fqn!r} is a {type(value).__name__}"
        storage = {(k.fqn, tuple(k.offset) if k.offset is not None else None):
                   (str(v.relative_path), int(v.offset), int(v.length)) for k, v in (meta.storage_data or {}).items()}
        return items, storage
    except Exception as exc:  # noqa: BLE001  (torch's own __setstate__ and pickle raise what they raise)
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def ours_dcp_metadata(data: bytes) -> DcpInventory | str:
    from guard.readers import READ_FAILURES
    from guard.training.dcp.layout import parse_metadata

    try:
        meta = parse_metadata(data)
    except READ_FAILURES as exc:
        return f"CG001: {str(exc)[:200]}"
    if meta.unsafe:
        return f"CG003: {', '.join(meta.unsafe[:3])}"
    items = {item.fqn: None if item.shape is None else
             (item.dtype, item.shape, tuple((c.offsets, c.sizes) for c in item.chunks)) for item in meta.items}
    storage = {(s.fqn, s.offset): (s.file, s.start, s.length) for s in meta.storage}
    return items, storage


def dcp_verdict(data: bytes) -> tuple[str, str]:
    """("agree" | a known category | "UNEXPLAINED", what each side said)."""
    ours, theirs = ours_dcp_metadata(data), reference_dcp_metadata(data)
    said = f"ours {ours if isinstance(ours, str) else 'read'}; theirs {theirs if isinstance(theirs, str) else 'read'}"
    if isinstance(ours, str) == isinstance(theirs, str) and (isinstance(ours, str) or ours == theirs):
        return "agree", said
    for known in KNOWN_TRAINING:
        if "dcp-metadata" in known.formats and known.we_accept == (not isinstance(ours, str)):
            if re.search(known.pattern, str(theirs if known.we_accept else ours)):
                return known.category, said
    if not isinstance(ours, str) and not isinstance(theirs, str):
        said += f"; ours {ours}; theirs {theirs}"
    return "UNEXPLAINED", said


# ------------------------------------------------------------------ one fuzz input (atheris targets, corpus replay)

def read_dcp_metadata_input(data: bytes) -> None:
    """What a scan does with a ``.metadata``: parse it, check it against a listing in which every file it
    names holds the bytes its storage says, and build the training record.  A refusal is a
    ``READ_FAILURES`` exception (CG001) or ``unsafe`` (CG003); anything else escaping is a bug."""
    from guard.readers import READ_FAILURES
    from guard.training.dcp.integrity import integrity_findings
    from guard.training.dcp.layout import parse_metadata
    from guard.training.dcp.roles import build_state

    try:
        meta = parse_metadata(data)
    except READ_FAILURES:
        return
    if meta.unsafe:
        return
    sizes: dict[str, int] = {".metadata": len(data)}
    for storage in meta.storage:
        sizes[storage.file] = max(sizes.get(storage.file, 0), storage.start + storage.length)
    list(integrity_findings(meta, sizes, name="ckpt", metadata_file=".metadata"))
    build_state(meta, path="ckpt", folder="ckpt", beside=frozenset(sizes))


def read_zero_input(data: bytes, name: str = "zero_pp_rank_0_mp_rank_00_model_states.pt") -> None:
    """What a scan does with one ZeRO rank file or one file of ``ds_to_universal``'s ``zero/`` folder: walk its
    zip and pickle (DeepSpeed's inert classes allowed), then read it as model states, as optimizer states and
    as a universal parameter file (``{'param': tensor, 'cat_dim': 0}``)."""
    from guard.readers import READ_FAILURES
    from guard.sources import BytesSource
    from guard.training.deepspeed.files import read_zero_file
    from guard.training.deepspeed.records import read_model_states, read_optim_states
    from guard.training.deepspeed.universal import param_in

    try:
        zfile = read_zero_file(BytesSource(data, name=name))
    except READ_FAILURES:
        return
    if zfile.unsafe:
        return
    for read in (read_model_states, read_optim_states, param_in):
        try:
            read(zfile)
        except READ_FAILURES:
            pass
