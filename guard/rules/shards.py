"""CG004: shard indexes against their shards."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

from guard.catalogue import make_finding
from guard.config import Policy
from guard.findings import Finding, shown
from guard.inventory import ModelInventory, line_in_json

_SAMPLE = 3


def check_shard_index(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    by_name = {posixpath.basename(scan.path): scan for scan in inv.files}
    for index in inv.indexes:
        if not index.weight_map:
            continue
        weights_name = posixpath.basename(index.path)[: -len(".index.json")]
        family = _family(weights_name)
        shards = sorted(set(index.weight_map.values()))
        for shard in shards:
            if shard not in by_name:
                line = line_in_json(index.text, next(k for k, v in index.weight_map.items() if v == shard))
                yield make_finding("CG004", index.path, f"shard {shard!r} listed in the index is missing",
                                   line=line)
        for shard in shards:
            scan = by_name.get(shard)
            if scan is None or scan.format is None:
                continue  # missing (above) or unreadable (CG001 already)
            listed = {k for k, v in index.weight_map.items() if v == shard}
            present = {_index_key(t.name, weights_name) for t in scan.tensors}
            missing = sorted(listed - present)
            extra = sorted(present - listed)
            if missing:
                yield make_finding(
                    "CG004", index.path,
                    f"{len(missing)} tensor(s) mapped to {shard!r} are not in it: {_sample(missing)}",
                    tensor=missing[0], line=line_in_json(index.text, missing[0]))
            if extra:
                yield make_finding(
                    "CG004", scan.path,
                    f"{len(extra)} tensor(s) in this shard are not in {posixpath.basename(index.path)}: "
                    f"{_sample(extra)}",
                    tensor=extra[0])
        for name, scan in sorted(by_name.items()):
            if name not in shards and _family(name) == family and name != weights_name:
                yield make_finding("CG004", scan.path,
                                   f"shard file is not referenced by {posixpath.basename(index.path)}")


def _family(filename: str) -> str:
    """'model-00001-of-00002.safetensors' and 'model.safetensors' -> 'model|.safetensors'."""
    stem, dot, ext = filename.rpartition(".")
    base = stem.split("-0", 1)[0]
    return f"{base}|.{ext}" if dot else filename


def _index_key(name: str, weights_name: str) -> str:
    return name


def _sample(names: list[str]) -> str:
    shown_ = ", ".join(shown(n) for n in names[:_SAMPLE])
    return shown_ + (f" and {len(names) - _SAMPLE} more" if len(names) > _SAMPLE else "")
