"""A DCP checkpoint's metadata against its files: every rank file there (CG114), every byte range inside its
file and apart from the others (CG115), every tensor's chunks tiling its global shape (CG116).

Each finding names the file it is about (``name/__1_0.distcp``, or ``name/.metadata`` for the chunks) and
at most a few tensors: a checkpoint of 100,000 tensors with one rank file gone gets one finding, not 50,000.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from math import prod

from guard.catalogue import make_finding
from guard.findings import Finding
from guard.training.dcp.layout import DcpChunk, DcpItem, DcpMetadata, DcpStorage

MAX_PAIRWISE = 4096  # chunks of one tensor compared pair by pair; past it, volumes and bounds only


def integrity_findings(meta: DcpMetadata, sizes: Mapping[str, int], *, name: str, metadata_file: str
                       ) -> Iterator[Finding]:
    """``sizes``: the checkpoint folder's files (name -> bytes)."""
    by_file: dict[str, list[DcpStorage]] = {}
    for entry in meta.storage:
        by_file.setdefault(entry.file, []).append(entry)
    for file, entries in sorted(by_file.items()):
        size = sizes.get(file)
        if size is None:
            yield make_finding("CG114", f"{name}/{file}", f"{metadata_file} places {len(entries)} item(s) in {file} "
                               f"(e.g. {entries[0].fqn}), which is missing: the checkpoint cannot be loaded",
                               tensor=entries[0].fqn)
            continue
        yield from _range_findings(file, size, entries, name=name)
    yield from _tiling_findings(meta, name=name, metadata_file=metadata_file)


def _range_findings(file: str, size: int, entries: list[DcpStorage], *, name: str) -> Iterator[Finding]:
    past = [e for e in entries if e.start + e.length > size]
    if past:
        first = past[0]
        yield make_finding("CG115", f"{name}/{file}", f"{file} is {size:,} bytes but {len(past)} item(s) end past it "
                           f"({first.fqn} at {first.start:,} + {first.length:,}): a truncated copy", tensor=first.fqn)
    ordered = sorted((e for e in entries if e.length), key=lambda e: e.start)
    for before, after in zip(ordered, ordered[1:]):
        if after.start < before.start + before.length:
            yield make_finding("CG115", f"{name}/{file}", f"the byte ranges of {before.fqn} ({before.start:,} + "
                               f"{before.length:,}) and {after.fqn} ({after.start:,}) overlap in {file}",
                               tensor=after.fqn)
            break


def _tiling_findings(meta: DcpMetadata, *, name: str, metadata_file: str) -> Iterator[Finding]:
    stored = {(e.fqn, e.offset) for e in meta.storage}
    bad: list[tuple[DcpItem, str]] = []
    for item in meta.items:
        if item.shape is None:
            if (item.fqn, None) not in stored:
                bad.append((item, "has no bytes stored"))
            continue
        why = chunk_problem(item.shape, item.chunks)
        if why is None:
            missing = next((c for c in item.chunks if (item.fqn, c.offsets) not in stored), None)
            if missing is not None:
                why = f"chunk at {list(missing.offsets)} has no bytes stored"
        if why is not None:
            bad.append((item, why))
    if bad:
        shown = "; ".join(f"{item.fqn} {list(item.shape or ())} {why}" for item, why in bad[:3])
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        yield make_finding("CG116", f"{name}/{metadata_file}", f"{len(bad)} item(s) whose chunks do not make the "
                           f"whole tensor: {shown}{more}", tensor=bad[0][0].fqn)


def chunk_problem(shape: tuple[int, ...], chunks: tuple[DcpChunk, ...]) -> str | None:
    """Why the chunks do not tile ``shape`` (None when they do): bounds, then volumes, then overlaps."""
    for chunk in chunks:
        if len(chunk.offsets) != len(shape):
            return f"chunk at {list(chunk.offsets)} has {len(chunk.offsets)} dims, the tensor {len(shape)}"
        if any(o + s > n for o, s, n in zip(chunk.offsets, chunk.sizes, shape)):
            return f"chunk at {list(chunk.offsets)} of {list(chunk.sizes)} runs outside the shape"
    total = sum(prod(c.sizes) for c in chunks)
    if total != prod(shape):
        return f"chunks hold {total:,} elements, the shape {prod(shape):,}"
    if len(chunks) <= MAX_PAIRWISE:
        for i, a in enumerate(chunks):
            for b in chunks[i + 1:]:
                if prod(a.sizes) and prod(b.sizes) and all(
                        ao < bo + bs and bo < ao + as_
                        for ao, as_, bo, bs in zip(a.offsets, a.sizes, b.offsets, b.sizes)):
                    return f"chunks at {list(a.offsets)} and {list(b.offsets)} overlap"
    return None
