"""A folder holding a PyTorch Distributed Checkpoint, read as one training-state set.

``.metadata`` (or, where the save ran without collectives, each rank's ``__R.metadata``) is the only
file read; the ``.distcp`` data files are listed with their sizes, never opened.  ``.distcp`` files with
no metadata at all are a save that never finished (CG117).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from guard.catalogue import make_finding
from guard.findings import Finding
from guard.readers import READ_FAILURES
from guard.records import Record
from guard.tensors import FileScan
from guard.training.dcp.hf_shards import ScanShard, is_hf_shard, scan_hf_shards
from guard.training.dcp.integrity import integrity_findings
from guard.training.dcp.layout import DcpItem, DcpMetadata, parse_metadata
from guard.training.dcp.roles import build_state
from guard.training.dirs import TrainingDir
from guard.training.megatron.common import COMMON, check_common
from guard.training.megatron.dirs import nemo_context
from guard.training.state import training_scan

METADATA = ".metadata"
_RANK_METADATA = re.compile(r"__(\d+)\.metadata\Z")
MAX_METADATA_BYTES = 256 * 1024 * 1024


# Megatron-core's torch_dist beside the DCP files: metadata.json ({"sharded_backend": "torch_dist"}) and
# common.pt, a torch.save of non-sharded state (an argparse.Namespace): listed, never unpickled.
MEGATRON_FILES = ("metadata.json", "common.pt")


def claim(directory: str, names: frozenset[str]) -> TrainingDir | None:
    owned = tuple(sorted(n for n in names if n.endswith(".distcp") or n == METADATA or _RANK_METADATA.match(n)
                         or is_hf_shard(n)))
    if not owned:
        return None
    if any(n.endswith(".distcp") for n in owned):  # Megatron's own files belong to its checkpoint, not weights
        owned += tuple(n for n in MEGATRON_FILES if n in names)
    elif not any(is_hf_shard(n) for n in owned) and not all(_is_pickle(os.path.join(directory, n)) for n in owned):
        return None  # a `.metadata` of some other tool, with no rank file beside it: not a DCP checkpoint
    return TrainingDir(directory, "dcp", owned)


def _is_pickle(path: str) -> bool:
    """Its first byte is pickle's PROTO opcode (torch writes protocol 4): one byte read, only for a lone metadata."""
    try:
        with open(path, "rb") as fh:
            return fh.read(1) == b"\x80"
    except OSError:
        return False


def folder_sizes(directory: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    with os.scandir(directory) as listing:
        for entry in listing:
            if entry.is_file(follow_symlinks=True):
                sizes[entry.name] = entry.stat().st_size
    return sizes


def scan(found: TrainingDir, *, name: str) -> FileScan:
    sizes = folder_sizes(found.directory)
    folder = os.path.basename(os.path.normpath(found.directory))
    total = sum(size for n, size in sizes.items() if n in found.claimed)
    shards = [n for n in found.claimed if is_hf_shard(n) and n in sizes]
    if shards and not any(n.endswith(".distcp") for n in sizes):
        return scan_hf_shards(found.directory, shards, name=name)
    read = read_metadata(found.directory, sizes, name=name)
    common = (lambda: check_common(found.directory, name=name)) if COMMON in found.claimed else None
    context = nemo_context(found.directory) if "metadata.json" in sizes else None
    return _scan_read(read, common, context, sizes, name=name, folder=folder, total=total)


def scan_listed(name: str, sizes: dict[str, int], read_whole: ReadWhole,
                common: Callable[[str], tuple[list[Finding], int]], scan_shard: ScanShard) -> FileScan:
    """A DCP folder as a Hub listing shows it (``sizes``: its files), its metadata fetched by ``read_whole`` and
    Megatron's ``common.pt`` walked by ``common(shown)``; the ``.distcp`` files are never read.  The HF storage
    writer's shards (no ``.distcp``) are read as locally, each header by ``scan_shard``."""
    folder = name.rstrip("/").rpartition("/")[2]
    claimed = claim_listed(frozenset(sizes))
    total = sum(size for n, size in sizes.items() if n in claimed)
    shards = [n for n in claimed if is_hf_shard(n)]
    if shards:
        return scan_hf_shards("", shards, name=name, scan_one=scan_shard)
    read = read_metadata("", sizes, name=name, read_whole=read_whole)
    found_common = (lambda: common(f"{name}/{COMMON}")) if COMMON in claimed else None
    return _scan_read(read, found_common, None, sizes, name=name, folder=folder, total=total)


def claim_listed(names: frozenset[str]) -> tuple[str, ...]:
    """The files of a DCP checkpoint with ``.distcp`` files among ``names`` (a Hub listing: no byte is read to
    tell a lone ``.metadata`` of another tool), Megatron's own files included; else the HF storage writer's
    shards (their names are the writer's own) with the ``.metadata`` beside them; () when there is neither."""
    if not any(n.endswith(".distcp") for n in names):
        shards = tuple(sorted(n for n in names if is_hf_shard(n)))
        return shards + ((METADATA,) if shards and METADATA in names else ())
    owned = tuple(sorted(n for n in names if n.endswith(".distcp") or n == METADATA or _RANK_METADATA.match(n)))
    return owned + tuple(n for n in MEGATRON_FILES if n in names)


def _scan_read(read: MetadataRead, common: Callable[[], tuple[list[Finding], int]] | None,
               context: tuple[str, ...] | None,
               sizes: dict[str, int], *, name: str, folder: str, total: int) -> FileScan:
    if read.metadata is None:
        return FileScan(path=name, format=None, size=total, findings=read.findings, bytes_read=read.bytes_read)
    findings = tuple(integrity_findings(read.metadata, sizes, name=name, metadata_file=read.files[0]))
    bytes_read = read.bytes_read
    if common is not None:  # Megatron's common.pt: walked by its allow-list (CG003), never unpickled
        common_findings, common_read = common()
        findings, bytes_read = findings + tuple(common_findings), bytes_read + common_read
    state = build_state(read.metadata, path=name, folder=folder, beside=frozenset(sizes))
    if context is not None:  # NeMo 2: weights/ beside context/, whose files are listed, never opened
        state = state._replace(trainer="NeMo 2 (Megatron-core torch_dist)",
                               items=state.items + (f"context/ ({len(context)} file(s), never loaded)",))
    return training_scan(state, path=name, fmt="dcp", size=total, findings=findings, bytes_read=bytes_read)


class MetadataRead(Record):
    metadata: DcpMetadata | None  # None: the findings say why (CG001, CG003, CG117)
    findings: tuple[Finding, ...]
    bytes_read: int
    files: tuple[str, ...]  # `.metadata`, or each rank's `__R.metadata`


ReadWhole = Callable[[str, int], bytes]  # (file name in the folder, at most this many bytes) -> its bytes


def _read_local(directory: str) -> ReadWhole:
    def read(metadata_file: str, limit: int) -> bytes:
        with open(os.path.join(directory, metadata_file), "rb") as fh:
            return fh.read(limit)
    return read


def read_metadata(directory: str, sizes: dict[str, int], *, name: str,
                  read_whole: ReadWhole | None = None) -> MetadataRead:
    """The checkpoint's metadata: `.metadata`, else every `__R.metadata` joined (a save without collectives).
    ``read_whole``: how a file's bytes are fetched (the Hub's); by default from ``directory``."""
    read_whole = read_whole or _read_local(directory)
    ranks = {} if METADATA in sizes else {n: int(m.group(1)) for n in sizes if (m := _RANK_METADATA.match(n))}
    files = [METADATA] if METADATA in sizes else sorted(ranks, key=ranks.__getitem__)
    if not files:
        data_files = sorted(n for n in sizes if n.endswith(".distcp"))
        finding = make_finding("CG117", f"{name}/{data_files[0]}" if data_files else name,
                               f"{len(data_files)} .distcp file(s) and no .metadata: torch writes it last, so this "
                               "save never finished and nothing can load it")
        return MetadataRead(None, (finding,), 0, ())
    read = 0
    merged: DcpMetadata | None = None
    for metadata_file in files:
        shown = f"{name}/{metadata_file}"
        if sizes[metadata_file] > MAX_METADATA_BYTES:
            return _unreadable(shown, f"{sizes[metadata_file]:,} bytes, past the read limit", read)
        data = read_whole(metadata_file, MAX_METADATA_BYTES + 1)
        read += len(data)
        try:
            meta = parse_metadata(data)
        except READ_FAILURES as exc:
            return _unreadable(shown, f"not a DCP metadata pickle: {_first_line(exc)}", read)
        if meta.unsafe:
            listed = ", ".join(meta.unsafe[:5]) + (" ..." if len(meta.unsafe) > 5 else "")
            finding = make_finding("CG003", shown, f"the .metadata pickle references {listed}, outside DCP's "
                                   "metadata classes; nothing was imported or called. torch.distributed.checkpoint "
                                   "loads it with plain pickle.load: do not load this checkpoint")
            return MetadataRead(None, (finding,), read, tuple(files))
        merged = meta if merged is None else DcpMetadata(merged.items + meta.items, merged.storage + meta.storage,
                                                         merged.version, ())
    assert merged is not None
    if len(files) > 1:  # each rank's metadata holds its own chunks: one item per tensor, chunks joined
        merged = _join_ranks(merged)
    return MetadataRead(merged, (), read, tuple(files))


def _join_ranks(meta: DcpMetadata) -> DcpMetadata:
    joined: dict[str, DcpItem] = {}
    for item in meta.items:
        held = joined.get(item.fqn)
        joined[item.fqn] = item if held is None else held._replace(chunks=held.chunks + item.chunks)
    return DcpMetadata(tuple(joined.values()), meta.storage, meta.version, ())


def _unreadable(shown: str, why: str, read: int) -> MetadataRead:
    return MetadataRead(None, (make_finding("CG001", shown, why),), read, ())


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__

