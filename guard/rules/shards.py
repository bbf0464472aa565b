"""CG004: shard indexes against their shards, one weight set at a time.

Every index form counts (``model.safetensors.index.json``, the variant forms
``.index.fp16.json`` and diffusers' deprecated ``.fp16.index.json``).  An index
that maps tensors into another set's shards says so; shards that stand without
any index are CG004 for the default copy and CG109 for a variant.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Iterator, Mapping

from guard.catalogue import make_finding
from guard.config import Policy
from guard.findings import Finding, shown
from guard.inventory import ModelInventory, WeightSet, line_in_json
from guard.inventory.model import UNUSABLE
from guard.tensors import TENSOR_NAME, column

_SAMPLE = 3


def check_shard_index(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    owners: dict[str, WeightSet] = {}  # shard file name -> its set, filled where an index is checked
    for ws in inv.sets:
        for finding in _check_set(ws, inv, owners):
            yield finding._replace(set=ws.name)


def _check_set(ws: WeightSet, inv: ModelInventory, owner: dict[str, WeightSet]) -> Iterator[Finding]:
    if (not ws.indexes and ws.variant is None and ws.layout in ("hf", "original")
            and any("-of-" in posixpath.basename(scan.path) for scan in ws.files)):
        yield make_finding("CG004", ws.files[0].path,
                           f"{len(ws.files)} shard file(s) of {ws.name} and no index naming them: "
                           "from_pretrained cannot load them")
    # proven: equal, byte for byte, to the index these shards make (inventory.index_proof); unusable: its
    # JSON or its map is not one (CG001 or CG004 already)
    checked = [index for index in ws.indexes if not index.proven and index.weight_map is not UNUSABLE]
    if not checked:
        return
    if not owner:
        owner.update((posixpath.basename(scan.path), other) for other in inv.sets for scan in other.files)
    by_name = {posixpath.basename(scan.path): scan for scan in ws.files}
    for index in checked:
        weight_map = index.weight_map
        if not weight_map:  # a map, but empty: from_pretrained would find none of the shards' tensors
            if ws.files:
                yield make_finding("CG004", index.path,
                                   f"the index maps no tensors: none of the {len(ws.files)} shard file(s) of "
                                   f"{ws.name} would load", line=line_in_json(index.text, "weight_map"))
            continue
        counts = Counter(weight_map.values())  # tensors per shard, counted in C: a 4,000-shard index walks it once
        shards = sorted(counts)
        by_shard: dict[str, list[str]] = {}  # the map inverted, once, at the first shard that disagrees
        for shard in shards:
            if shard in by_name:
                continue
            line = line_in_json(index.text, _inverted(weight_map, by_shard)[shard][0])
            other = owner.get(shard)
            if other is not None:
                yield make_finding("CG004", index.path,
                                   f"the index maps tensors to {shard!r}, a shard of another weight set "
                                   f"({other.name}), not of {ws.name}", line=line)
            else:
                yield make_finding("CG004", index.path, f"shard {shard!r} listed in the index is missing",
                                   line=line)
        for shard in shards:
            scan = by_name.get(shard)
            if scan is None or scan.format is None:
                continue  # missing (above) or unreadable (CG001 already)
            names = list(column(TENSOR_NAME, scan.tensors))
            # the common case, decided without inverting the map: every name in the shard is unique and
            # mapped to it, and the index maps no more names to it than that (so the two sets are equal);
            # a safetensors header's names are unique already (its reader refuses a duplicate key)
            unique = scan.format == "safetensors" or len(set(names)) == len(names)
            if unique and len(names) == counts[shard] and list(map(weight_map.get, names)).count(shard) == len(names):
                continue
            present = set(names)
            listed = set(_inverted(weight_map, by_shard)[shard])
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
            if name not in counts:
                yield make_finding("CG004", scan.path,
                                   f"shard file is not referenced by {posixpath.basename(index.path)}")



def _inverted(weight_map: Mapping[str, str], by_shard: dict[str, list[str]]) -> dict[str, list[str]]:
    """Shard -> its tensors in index order, filled on first need (only where something disagrees)."""
    if not by_shard:
        for key, value in weight_map.items():
            by_shard.setdefault(value, []).append(key)
    return by_shard


def _sample(names: list[str]) -> str:
    shown_ = ", ".join(shown(n) for n in names[:_SAMPLE])
    return shown_ + (f" and {len(names) - _SAMPLE} more" if len(names) > _SAMPLE else "")
