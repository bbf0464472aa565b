"""Megatron-core's ``common.pt``: walked with an allow-list, never unpickled.

``dist_checkpointing.save`` writes the state dict's non-sharded part (Megatron's training loop keeps its
``args`` there: an ``argparse.Namespace`` of numbers, strings and a torch dtype, plus ``iteration`` and
``checkpoint_version``) to ``common.pt`` with ``torch.save``, and ``dist_checkpointing.load`` reads it back
with ``torch.load(weights_only=False)``: an untrusted checkpoint can run code there.  The walk accepts
torch's weights-only globals, the Namespace and the enums Megatron's arguments hold (the megatron row's list,
``guard.training.registry.MEGATRON_COMMON``); every other global is CG003, and nothing is imported or called.
"""

from __future__ import annotations

import os

from guard.catalogue import make_finding
from guard.findings import Finding
from guard.readers import READ_FAILURES
from guard.readers.binary.zipdir import read_zip_archive
from guard.readers.torch.archive import walk_record
from guard.readers.torch.tensors import CountingSource
from guard.sources import ByteSource, LocalFile
from guard.training.pickles import AllowListWalker
from guard.training.registry import MEGATRON_COMMON

COMMON = "common.pt"
MAX_COMMON_BYTES = 64 * 1024 * 1024


def check_common(directory: str, *, name: str) -> tuple[list[Finding], int]:
    """(findings, bytes read) for the folder's common.pt: CG003 for a global outside the allow-list, CG001
    for a file that is not a torch.save zip.  Its tensors, if any, are not read."""
    path = os.path.join(directory, COMMON)
    shown = f"{name}/{COMMON}"
    try:
        size = os.path.getsize(path)
    except OSError:
        return [], 0
    if size > MAX_COMMON_BYTES:
        return [make_finding("CG001", shown, f"{size:,} bytes, past the read limit for Megatron's common state")], 0
    with LocalFile(path, name=shown) as source:
        return check_common_source(source, shown=shown)


def check_common_source(source: ByteSource, *, shown: str) -> tuple[list[Finding], int]:
    """``check_common`` on any byte source (a local file, a Hub file read by ranges)."""
    counted = CountingSource(source)
    walker = AllowListWalker(MEGATRON_COMMON)
    try:
        archive = read_zip_archive(counted)
        first = next(iter(archive.entries), "")
        entry = archive.entries.get(f"{first.split('/', 1)[0]}/data.pkl")
        if entry is None:
            return [make_finding("CG001", shown, "not a torch.save zip (no data.pkl)")], counted.bytes_read
        walk_record(counted, entry, walker)
    except READ_FAILURES as exc:
        first_line = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return [make_finding("CG001", shown, f"Megatron's common state is unreadable: {first_line}")], \
            counted.bytes_read
    if walker.unsafe:
        listed = ", ".join(list(walker.unsafe)[:5]) + (" ..." if len(walker.unsafe) > 5 else "")
        return [make_finding("CG003", shown, f"common.pt references {listed}, outside what Megatron-core saves "
                             "there; nothing was imported or called. dist_checkpointing.load unpickles it with "
                             "weights_only=False: do not load this checkpoint")], counted.bytes_read
    return [], counted.bytes_read
