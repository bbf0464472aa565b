"""``HuggingFaceStorageWriter(save_distributed=True)``'s shards, read as one model with global shapes.

Each rank writes ``shard-0000K-model-0000I-of-0000N.safetensors`` holding its *shards* of the tensors,
with ``__metadata__["DCP_SHARDING_INFO"] = {fqn: {"saved_offsets": [...]}}``: where its piece sits in the
whole.  Read as plain safetensors, they are K models of 1/K of the parameters each; here each tensor's
global shape is where its pieces end, and the pieces must tile it (CG116).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from guard import jsonload
from guard.catalogue import make_finding
from guard.findings import Finding
from guard.readers import scan_file
from guard.records import Record
from guard.sources import LocalFile
from guard.tensors import FileScan, TensorInfo
from guard.training.dcp.integrity import chunk_problem
from guard.training.dcp.layout import DcpChunk
from guard.training.state import TrainingState, count_homes, model_key, training_scan

SHARD_NAME = re.compile(r"shard-(\d+)-model-(\d+)-of-(\d+)\.safetensors\Z")
SHARDING_KEY = "DCP_SHARDING_INFO"


def is_hf_shard(name: str) -> bool:
    return SHARD_NAME.match(name) is not None


class HfShards(Record):
    state: TrainingState
    findings: tuple[Finding, ...]
    bytes_read: int
    size: int
    pieces: dict[str, list[tuple[TensorInfo, tuple[int, ...]]]]  # fqn -> (a rank's piece, where it sits in the whole)


# (file name, name shown) -> the shard's header scan: a local file's, or a Hub file's by ranged reads
ScanShard = Callable[[str, str], FileScan]


def scan_hf_shards(directory: str, names: list[str], *, name: str, scan_one: ScanShard | None = None) -> FileScan:
    read = read_hf_shards(directory, names, name=name, scan_one=scan_one)
    return training_scan(read.state, path=name, fmt="dcp", size=read.size, findings=read.findings,
                         bytes_read=read.bytes_read)


def _local_scanner(directory: str) -> ScanShard:
    def scan_one(file: str, shown: str) -> FileScan:
        with LocalFile(os.path.join(directory, file), name=shown) as source:
            return scan_file(source)
    return scan_one


def read_hf_shards(directory: str, names: list[str], *, name: str, scan_one: ScanShard | None = None) -> HfShards:
    pieces: dict[str, list[tuple[TensorInfo, tuple[int, ...]]]] = {}
    findings: list[Finding] = []
    read = total = 0
    ranks: set[str] = set()
    scan_one = scan_one or _local_scanner(directory)
    for file in sorted(names):
        shown = f"{name}/{file}"
        scan = scan_one(file, shown)
        read += scan.bytes_read
        total += scan.size
        findings.extend(scan.findings)
        if scan.format != "safetensors":
            continue
        ranks.add(SHARD_NAME.match(file).group(1))  # type: ignore[union-attr]  # file was picked by SHARD_NAME, so it matches
        offsets = _sharding_info(scan.metadata.get(SHARDING_KEY), shown, findings)
        for tensor in scan.tensors:
            saved = offsets.get(tensor.name, (0,) * len(tensor.shape))
            if len(saved) != len(tensor.shape) or min(saved, default=0) < 0:
                findings.append(make_finding("CG116", shown, f"{tensor.name}: saved_offsets {list(saved)} has "
                                             f"{len(saved)} dims, the shard {len(tensor.shape)}", tensor=tensor.name))
                continue
            pieces.setdefault(tensor.name, []).append((tensor, saved))
    weights: list[TensorInfo] = []
    bad: list[str] = []
    for fqn, held in pieces.items():
        shape = tuple(max(dims) for dims in zip(*(tuple(o + n for o, n in zip(off, t.shape)) for t, off in held))) \
            if held[0][0].shape else ()
        why = chunk_problem(shape, tuple(DcpChunk(off, t.shape) for t, off in held))
        if why is None and len({t.dtype for t, _ in held}) > 1:
            why = f"its pieces disagree on the dtype ({', '.join(sorted({t.dtype for t, _ in held}))})"
        if why is not None:
            bad.append(f"{fqn} {list(shape)} {why}")
        weights.append(TensorInfo(model_key((fqn,)), held[0][0].dtype, shape, name))
    numbers = sorted(int(r) for r in ranks)
    absent = sorted(set(range(1, numbers[-1] + 1)) - set(numbers)) if numbers else []
    if absent:  # ranks number their files from 1: a hole is a rank's file gone (the last one leaves none)
        width = len(next(iter(ranks)))
        findings.append(make_finding("CG114", f"{name}/shard-{absent[0]:0{width}d}-model-*.safetensors",
                                     f"no file of rank(s) {', '.join(map(str, absent))} while rank {numbers[-1]}'s "
                                     "is there: their pieces of every tensor are missing"))
    if bad:
        findings.append(make_finding("CG116", name, f"{len(bad)} tensor(s) whose shards do not make the whole "
                                     f"tensor: {'; '.join(bad[:3])}"))
    state = TrainingState("torch HuggingFaceStorageWriter (save_distributed)", "dcp-safetensors", "dcp",
                          len(ranks) or None, f"sharded over {len(ranks)} rank file(s)", tuple(weights), "module",
                          count_homes(("module", t.dtype, t.numel) for t in weights), (), tuple(sorted(names)))
    return HfShards(state, tuple(findings), read, total, pieces)


def _sharding_info(text: str | None, shown: str, findings: list[Finding]) -> dict[str, tuple[int, ...]]:
    if text is None:
        findings.append(make_finding("CG116", shown, f"no {SHARDING_KEY} in __metadata__: where this rank's "
                                     "pieces sit in the whole tensors is unknown"))
        return {}
    try:
        info = jsonload.loads(text)
        return {str(k): tuple(int(o) for o in v["saved_offsets"]) for k, v in info.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        findings.append(make_finding("CG001", shown, f"{SHARDING_KEY} is not a map of saved_offsets: {exc}"[:300]))
        return {}
