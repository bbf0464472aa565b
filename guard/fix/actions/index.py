"""index-rebuild (CG109): a variant's shards stand without their index; write it from the shards' headers.

The index is what ``save_pretrained`` writes beside its shards: ``weight_map`` (tensor ->
shard file) and ``metadata.total_size`` (the bytes of every tensor), ``json.dumps(indent=2,
sort_keys=True)`` and a newline.  Its name is planned by the rule (the index convention that
goes with the shards' own naming).  Only an index for a complete run of shards 1..N is written:
a missing shard's tensors are not here to list.  The written index is verified the way a scan
checks one (CG004: every mapped tensor in its shard, every shard's tensor mapped).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from guard import jsonload
from guard.catalogue import make_finding
from guard.config import Policy
from guard.errors import GuardError
from guard.findings import Finding
from guard.fix.context import ActionContext, Staged
from guard.fixes import Fix
from guard.inventory import build_inventory, scan_local_file
from guard.inventory.names import classify
from guard.tensors import FileScan


def index_text(weight_map: dict[str, str], total_size: int, extra: dict[str, object] | None = None) -> str:
    """An index as transformers' and diffusers' save_pretrained write it."""
    metadata = {**(extra or {}), "total_size": total_size}
    return json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n"


def write_text_file(path: Path, text: str) -> None:
    """A small file, written and fsynced (the staging directory is fsynced by whoever publishes)."""
    with open(path, "x", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def verify_index(index: Path, shards: list[Path], *, total_size: int) -> list[Finding]:
    """CG301 for a written index that does not describe its shards as a scan would check it (CG004)."""
    data = index.read_bytes()
    scans: list[FileScan] = [scan_local_file(path) for path in shards]
    inventory = build_inventory(str(index.parent), scans, json_files={str(index): data})
    from guard.rules.shards import check_shard_index  # the scanner's own check, not a second one

    problems = [f.message for f in inventory.findings]
    problems += [f.message for f in check_shard_index(inventory, Policy())]
    try:
        written_total = jsonload.loads(data)["metadata"]["total_size"]
    except (ValueError, KeyError, TypeError):
        written_total = None
    if written_total != total_size:
        problems.append(f"metadata.total_size is {written_total!r}, the tensors hold {total_size:,} bytes")
    return [make_finding("CG301", index.name, f"written index does not read back: {problem}")
            for problem in problems]


def shard_run(names: list[str]) -> list[str]:
    """The shard names ordered 1..N; a GuardError unless they are exactly one complete run."""
    numbered = sorted((classify(name).shard or (0, 0), name) for name in names)
    totals = {total for (_, total), _ in numbered}
    numbers = [number for (number, _), _ in numbered]
    if len(totals) != 1 or numbers != list(range(1, len(numbers) + 1)) or numbers[-1:] != list(totals):
        raise GuardError(f"{', '.join(names)}: not one complete run of shards 1..N; no index written")
    return [name for _, name in numbered]


def stage_index_rebuild(fix: Fix, ctx: ActionContext) -> Staged:
    args = fix.arguments
    index_name = str(args["index"])
    display = str(args.get("dir", ctx.model_dir))
    final = ctx.final(index_name)
    if final.exists() or final.is_symlink():
        raise GuardError(f"{display}/{index_name} already exists; index-rebuild only adds a missing index")
    shards = shard_run([str(name) for name in args.get("reads", [])])
    weight_map: dict[str, str] = {}
    total = 0
    for name in shards:
        scan = scan_local_file(ctx.final(name))
        broken = [f for f in scan.findings if f.severity.value == "error"]
        if broken or scan.format not in ("safetensors", "torch-zip", "torch-legacy"):
            why = broken[0].message if broken else f"{scan.format or 'unknown'} format"
            raise GuardError(f"{display}/{name}: cannot list its tensors ({why}); no index written")
        for tensor in scan.tensors:
            if tensor.name in weight_map:
                raise GuardError(f"{display}/{name}: a tensor is also in {weight_map[tensor.name]}; "
                                 "the shards overlap, no index written")
            weight_map[tensor.name] = name
            total += tensor.nbytes or 0
    staged = ctx.staging / index_name
    write_text_file(staged, index_text(weight_map, total))
    findings = verify_index(staged, [ctx.final(name) for name in shards], total_size=total)
    return Staged(files=[(staged, final)], findings=findings,
                  summary=f"wrote {index_name}: {len(weight_map):,} tensors in {len(shards)} shard(s), "
                          f"{total:,} bytes",
                  details={"index": index_name, "shards": shards, "tensors": len(weight_map), "total_size": total})
