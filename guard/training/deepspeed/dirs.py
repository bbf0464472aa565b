"""A DeepSpeed ZeRO tag directory (``global_stepN/``) read into one TrainingState; ``latest`` checked.

``claim`` takes a directory holding ``*_model_states.pt`` / ``*_optim_states.pt`` (DeepSpeed's names,
``guard.training.deepspeed.files.FILE_NAME``), and a save directory whose ``latest`` names no tag folder
(CG119).  ``scan`` reads every rank's files (headers and pickles, never a tensor's bytes), checks the
ranks are all there (CG114) and that the partitions add up to ``param_shapes`` (CG118), and reports the
model's logical tensors in the masters' dtype, with the real parameter count.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.records import Record
from guard.sources import ByteSource, LocalFile
from guard.tensors import FileScan, TensorInfo
from guard.training.deepspeed.files import ZeroFile, parse_name, read_zero_file
from guard.training.deepspeed.partitions import Piece, Placed, place
from guard.training.deepspeed.records import ModelStates, OptimStates, read_model_states, read_optim_states
from guard.training.deepspeed.universal import FOLDER, is_universal, read_universal
from guard.training.dirs import TrainingDir
from guard.training.state import TrainingState, count_homes, model_key, training_scan

LAYOUT = "deepspeed"
LATEST = "latest"
SCRIPT = "zero_to_fp32.py"  # DeepSpeed copies it beside `latest` on every save
_TAG = re.compile(r"[A-Za-z0-9_.\-]{1,255}")
_MAX_LATEST = 4096
UNIVERSAL_CLAIM = f"{FOLDER}/"  # a claimed folder (its name ends in "/"): nothing under it is a model of its own


def claim(directory: str, names: frozenset[str]) -> TrainingDir | None:
    ranks = tuple(sorted(n for n in names if parse_name(n) is not None))
    if ranks and is_universal(directory):  # ds_to_universal's output: the folder of parameter folders is its own
        return TrainingDir(directory, LAYOUT, (*ranks, UNIVERSAL_CLAIM))
    if ranks:
        return TrainingDir(directory, LAYOUT, ranks)
    if LATEST in names and latest_problem(directory, names) is not None:
        return TrainingDir(directory, LAYOUT, (), (LATEST,))
    return None


def latest_problem(directory: str, names: frozenset[str]) -> str | None:
    """Why ``latest`` names no tag folder here; None when it does, or when it is not DeepSpeed's."""
    try:
        with open(os.path.join(directory, LATEST), "rb") as fh:
            raw = fh.read(_MAX_LATEST + 1)
    except OSError:
        return None
    tag = raw.decode("utf-8", "replace").strip()
    deepspeed = SCRIPT in names or re.fullmatch(r"global_step\d+", tag) is not None
    if not deepspeed:
        return None  # a file named `latest` of something else
    if len(raw) > _MAX_LATEST or not _TAG.fullmatch(tag) or tag in (".", ".."):
        return f"`latest` holds {shown(tag[:80])}, which is not a tag folder's name"
    if not os.path.isdir(os.path.join(directory, tag)):
        return f"`latest` names the tag {tag!r}, and there is no folder {tag}/ beside it"
    return None


class ZeroRanks(Record):
    """Every rank's files of one tag directory, read (tensor-parallel ranks past 0 counted, not read)."""

    models: dict[int, ModelStates]
    optims: dict[int, OptimStates]
    findings: list[Finding]
    size: int
    bytes_read: int


OpenFile = Callable[[str, str], ByteSource]  # (file name in the tag folder, name to show) -> its bytes


def read_ranks(found: TrainingDir, *, name: str, open_file: OpenFile | None = None) -> ZeroRanks:
    """Every rank's file, from disk (placed, for conversion) or through ``open_file`` (a Hub scan: sizes
    only, no request per storage)."""
    ranks = ZeroRanks({}, {}, [], 0, 0)
    sizes = [0, 0]
    for file_name in found.claimed:
        zname = parse_name(file_name)
        if zname is None:
            continue  # the universal checkpoint's folder: read by guard.training.deepspeed.universal
        shown_path = f"{name.rstrip('/')}/{file_name}"
        try:
            if open_file is None:
                with LocalFile(os.path.join(found.directory, file_name), name=shown_path) as local:
                    sizes[0] += local.size
                    zfile = read_zero_file(local)
            else:
                remote = open_file(file_name, shown_path)
                sizes[0] += remote.size
                zfile = read_zero_file(remote, locate=False)
        except MalformedCheckpoint as exc:
            ranks.findings.append(make_finding("CG001", shown_path, f"unreadable checkpoint: {exc}"))
            continue
        sizes[1] += zfile.bytes_read
        if zfile.unsafe:
            ranks.findings.extend(_unsafe(zfile))
            continue
        if zname.mp != 0:
            continue  # tensor-parallel ranks: counted as files, consolidated by none of zero_to_fp32's rules
        try:
            if zname.kind == "model":
                ranks.models[zname.dp or 0] = read_model_states(zfile)
            else:
                ranks.optims[zname.dp or 0] = read_optim_states(zfile)
        except MalformedCheckpoint as exc:
            ranks.findings.append(make_finding("CG001", shown_path, f"unreadable checkpoint: {exc}"))
    return ranks._replace(size=sizes[0], bytes_read=sizes[1])


def scan(found: TrainingDir, *, name: str) -> FileScan:
    if not found.claimed:
        return _latest_scan(found, name=name)
    ranks = read_ranks(found, name=name)
    state, more, _ = build_state(found, name=name, models=ranks.models, optims=ranks.optims)
    return training_scan(state, path=name, fmt="deepspeed", size=ranks.size,
                         findings=[*ranks.findings, *more], bytes_read=ranks.bytes_read,
                         metadata=_config_beside(found.directory))


def _config_beside(directory: str) -> dict[str, str]:
    """A model's config.json in the tag folder or the save folder (the Trainer's checkpoint-N/): the folder
    is a model's, about to be published (guard.rules.publishing)."""
    for folder in (directory, os.path.dirname(directory)):
        if os.path.isfile(os.path.join(folder, "config.json")):
            return {"training.config": "config.json beside the checkpoint"}
    return {}


def _unsafe(zfile: ZeroFile) -> list[Finding]:
    return [make_finding("CG003", zfile.path, f"pickle references {dotted}, which is in neither the tensor "
                         "allowlist nor DeepSpeed's inert classes (it was not imported or called)")
            for dotted in zfile.unsafe]


def build_state(found: TrainingDir, *, name: str, models: dict[int, ModelStates],
                optims: dict[int, OptimStates]) -> tuple[TrainingState, list[Finding], list[Placed]]:
    """The TrainingState, its integrity findings (CG114 ranks, CG118 sizes) and the placed tensors."""
    findings: list[Finding] = []
    first = models.get(0)
    stage = next(iter(optims.values())).stage if optims else (first.stage if first else None)
    count = max((o.partition_count for o in optims.values()), default=0)
    dp = (first.dp_world_size if first else None) or count or None
    mp = (first.mp_world_size if first else None) or 1
    universal = UNIVERSAL_CLAIM in found.claimed
    if not universal:
        findings += _missing_ranks(found, name=name, stage=stage, dp=dp, models=models, optims=optims)
    placed: list[Placed] = []
    extra: list[tuple[str, str, int]] = []  # the universal folders' tensors: (kind, dtype, elements)
    complete = first is not None and (not optims or len(optims) == count)
    if universal and first is not None:
        placed, extra, problems = read_universal(found.directory, name, first)
        findings += problems
        placed = [p for p in place(first, [], [])[0] if p.kind == "buffer"] + placed
    elif first is not None and not optims and not stage and not findings:  # no ZeRO: the module is the model
        placed = [Placed(t.name, t.dtype, t.shape, (Piece(t.file, t.data_start, t.numel),), "module")
                  for t in first.module if t.numel]
    elif complete and first is not None and not findings:  # complete: first is set
        ranks = [optims[r] for r in sorted(optims)]
        fragments = [models[r] for r in sorted(models)] if stage == 3 else []
        placed, messages = place(first, ranks, fragments)
        findings += [make_finding("CG118", name, f"ZeRO partitions do not add up to param_shapes: {p}")
                     for p in messages]
    weights = tuple(TensorInfo(model_key((p.name,)), "F32" if p.upcast else p.dtype, p.shape, name)
                    for p in placed if p.alias_of is None)
    homes = count_homes([("module", t.dtype, t.numel) for m in models.values() for t in m.module]
                        + [("master", t.dtype, t.numel) for o in optims.values() for t in o.masters]
                        + [("optimizer", t.dtype, t.numel) for o in optims.values() for t in o.moments] + extra)
    version = next((m.version for m in models.values() if m.version), None)
    sharding = f"ZeRO-{stage}" if stage is not None else "ZeRO"
    if mp > 1:
        sharding += f", {mp} tensor-parallel ranks"
    if universal:
        sharding, dp, mp = "ZeRO universal checkpoint (any world size)", None, 1
    state = TrainingState(
        trainer=f"DeepSpeed {version}" if version else "DeepSpeed", format="zero", layout=LAYOUT,
        world_size=(dp or 0) * mp or None, sharding=sharding, weights=weights,
        publishes="master" if optims or universal else "module", homes=homes,
        items=first.items if first else (), files=found.claimed)
    return state, findings, placed


def _missing_ranks(found: TrainingDir, *, name: str, stage: int | None, dp: int | None,
                   models: dict[int, ModelStates], optims: dict[int, OptimStates]) -> list[Finding]:
    """CG114: a rank's file that partition_count or dp_world_size expects and is not in the folder."""
    present = {parse_name(n) for n in found.claimed}
    have_optim = {z.dp for z in present if z is not None and z.kind == "optim" and z.mp == 0}
    have_model = {z.dp for z in present if z is not None and z.kind == "model" and z.mp == 0}
    bf16 = any(z is not None and z.bf16 for z in present) or any(m.bf16 for m in models.values())
    missing: list[str] = []
    count = max((o.partition_count for o in optims.values()), default=0)
    for rank in range(count):
        if rank not in have_optim:
            missing.append(f"{'bf16_' if bf16 else ''}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    if stage == 3:
        for rank in range(dp or count):
            if rank not in have_model:
                missing.append(f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
    elif None not in have_model and 0 not in have_model:
        missing.append("mp_rank_00_model_states.pt")
    if stage and not have_optim:  # ZeRO 1-3 keep the masters in the optimizer files: none at all is no checkpoint
        missing += [f"{'bf16_' if bf16 else ''}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
                    for rank in range(dp or 1)]
    if not missing:
        return []
    expects = f"partition_count {count}" if count else "the ZeRO layout"
    return [make_finding("CG114", f"{name.rstrip('/')}/{file}", f"rank file missing: {expects} expects {file}, "
                         "which is not in the checkpoint folder; it cannot be loaded or consolidated")
            for file in missing]


def _latest_scan(found: TrainingDir, *, name: str) -> FileScan:
    problem = latest_problem(found.directory, frozenset(os.listdir(found.directory))) or "`latest` names no tag"
    return latest_scan(name, problem)


def tag_problem(raw: bytes, folders: frozenset[str], *, script: bool = True) -> str | None:
    """Why a ``latest`` holding ``raw`` names none of ``folders`` (a Hub listing's view); None when it does,
    or (``script``: whether zero_to_fp32.py is beside it) when it is not DeepSpeed's, as ``latest_problem``."""
    tag = raw[:_MAX_LATEST].decode("utf-8", "replace").strip()
    if not script and re.fullmatch(r"global_step\d+", tag) is None:
        return None  # a file named `latest` of something else
    if len(raw) > _MAX_LATEST or not _TAG.fullmatch(tag) or tag in (".", ".."):
        return f"`latest` holds {shown(tag[:80])}, which is not a tag folder's name"
    return None if tag in folders else f"`latest` names the tag {tag!r}, and there is no folder {tag}/ beside it"


def latest_scan(name: str, problem: str) -> FileScan:
    """The set a save folder's broken ``latest`` makes: no weights, one CG119."""
    path = f"{name.rstrip('/')}/{LATEST}" if name not in ("", ".") else LATEST
    state = TrainingState("DeepSpeed", "zero", LAYOUT, None, "ZeRO", (), "master", files=(LATEST,))
    finding = make_finding("CG119", path, f"{problem}: zero_to_fp32.py and load_checkpoint() fail on this folder")
    return training_scan(state, path=name, fmt="deepspeed", size=0, findings=[finding])



def listed_tag_dirs(listing: dict[str, int | None]) -> dict[str, dict[str, int]]:
    """A repository listing's ZeRO tag folders (path -> {file name: size}): a Hub scan's view of them."""
    found: dict[str, dict[str, int]] = {}
    for path, size in listing.items():
        folder, _, base = path.rpartition("/")
        if parse_name(base) is not None:
            found.setdefault(folder, {})[base] = size or 0
    return found


def scan_listed(name: str, files: dict[str, int], open_file: OpenFile, *, config_beside: bool) -> FileScan:
    """A tag folder read file by file through ``open_file`` (ranged reads of the Hub)."""
    found = TrainingDir(name, LAYOUT, tuple(sorted(files)))
    ranks = read_ranks(found, name=name, open_file=open_file)
    state, more, _ = build_state(found, name=name, models=ranks.models, optims=ranks.optims)
    metadata = {"training.config": "config.json beside the checkpoint"} if config_beside else {}
    return training_scan(state, path=name, fmt="deepspeed", size=ranks.size, findings=[*ranks.findings, *more],
                         bytes_read=ranks.bytes_read, metadata=metadata)
