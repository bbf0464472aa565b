"""Weight sets: the files of one model directory that together make one loadable copy.

A set is a format copy (safetensors, PyTorch, Flax, ...), a variant of one
(``model.fp16.safetensors``), an original-layout copy (``consolidated.*``), an
adapter, or one file of training state.  Shards and their index are one set.
Grouping reads names only (``guard.inventory.conventions``); the headers were
read already.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from math import prod

from guard import dtypes
from guard.inventory.conventions import DTYPE_VARIANTS, FORMAT_ORDER, LAYOUT_ORDER, LIGHTNING_STATE_KEYS
from guard.inventory.names import FileRole, claimed_dtype, classify
from guard.inventory.stats import DtypeStats, ShardIndex, dtype_summary, grouped_dtype_summary
from guard.records import Record
from guard.tensors import (
    TENSOR_DTYPE,
    TENSOR_SHAPE,
    TENSOR_STORAGE,
    FileScan,
    TensorInfo,
    column as columns,
    joined,
    select,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (the hook's path)
if TYPE_CHECKING:  # annotations only
    from typing import Any

# What a reader's file format means for the set's format family (names that say nothing).
_READER_FAMILIES = {"torch-zip": "torch", "torch-legacy": "torch", "torchscript": "torch", "torch-export": "torch",
                    "flax-msgpack": "flax", "tf-bundle": "tensorflow"}
_DIFFUSERS_STEMS = ("diffusion_pytorch_model", "diffusion_flax_model")


# memo key: the set's names sorted and each one's position in its files' columns taken in turn, kept by the
# index proof (guard.inventory.index_proof), which sorts them, for the loading check (guard.rules.loading)
BY_NAME = "by_name"


class WeightSet(Record):
    name: str  # unique within the model: a file name, an index name, or a shard pattern
    role: str  # "weights" | "adapter" | "training-state"
    layout: str  # "hf" | "original" | "peft" | "trainer" | "fsdp" | "lightning" | "file"
    stem: str
    format: str  # "safetensors" | "torch" | "flax" | "gguf" | ... ; "" when neither name nor reader says
    variant: str | None
    sharded: bool
    files: tuple[FileScan, ...]
    indexes: tuple[ShardIndex, ...]
    claimed_dtype: str | None  # the dtype its name claims (a dtype variant, `*_fp16.onnx`, ...)
    primary: bool
    memo: dict[object, Any]  # work the rules share (policed tensors, dtype summaries): per set, not per rule

    @property
    def variant_dtype(self) -> str | None:
        return DTYPE_VARIANTS.get(self.variant.lower()) if self.variant else None

    @property
    def judged(self) -> bool:
        """Dtype rules (CG101-CG109) apply; training state is read for integrity and safety only, but for a
        training checkpoint read as one set (guard.training), whose tensors are what it would publish."""
        return self.role != "training-state" or bool(self.files and self.files[0].training is not None)

    @property
    def tensors(self) -> Iterator[TensorInfo]:
        """The set's weights (a Lightning checkpoint's optimizer and loop state left out)."""
        for scan in self.files:
            for tensor in scan.tensors:
                if self.layout == "lightning" and tensor.name.split(".", 1)[0] in LIGHTNING_STATE_KEYS:
                    continue
                yield tensor

    @property
    def has_tensors(self) -> bool:
        """Whether ``tensors`` yields any: a file's length where no tensor is left out (no record made)."""
        if self.layout == "lightning":
            return next(iter(self.tensors), None) is not None
        return any(map(len, (scan.tensors for scan in self.files)))

    @property
    def counted_tensors(self) -> Iterator[TensorInfo]:
        """Tied aliases counted once: a .bin keeps both names of a tied weight on one storage."""
        seen: set[tuple[object, ...]] = set()
        for tensor in self.tensors:
            if tensor.storage is not None and tensor.storage_offset is not None:
                key = (tensor.file, tensor.storage, tensor.storage_offset, tensor.dtype, tensor.shape, tensor.stride)
                if key in seen:
                    continue
                seen.add(key)
            yield tensor

    def by_dtype(self) -> dict[str, Sequence[TensorInfo]]:
        """The set's tensors by dtype code, codes in order of first appearance, tensors in file order.

        Built once per set: every rule asks for some dtypes of the set, and most ask for a few
        (F64, BF16/F16, a target's unsupported codes), so they look up groups instead of walking
        every tensor again.
        """
        return self._tally()[0]

    def parameters_by_dtype(self) -> dict[str, int]:
        """Elements per dtype code over ``tensors`` (tied aliases included), in ``by_dtype`` order."""
        return self._tally()[1]

    def dtype_summary(self) -> dict[str, DtypeStats]:
        summary = self.memo.get("dtype_summary")
        if summary is None:
            groups, totals, shared = self._tally()
            if shared:  # a storage can hold tied aliases, to be counted once
                summary = dtype_summary(self.counted_tensors)
            else:  # every tensor counts: the groups already hold the sums
                summary = grouped_dtype_summary(groups, totals)
            self.memo["dtype_summary"] = summary
        return summary

    def _tally(self) -> tuple[dict[str, Sequence[TensorInfo]], dict[str, int], bool]:
        """One walk of the set's tensors: the groups by dtype, their elements, whether any has a storage.

        A group is its files' parts joined (``guard.tensors.joined``): a file's columns where it keeps
        them, so a sharded set's groups hold no record the reader did not make."""
        tally = self.memo.get("tally")
        if tally is None:
            groups: dict[str, list[Sequence[TensorInfo]]] = {}
            totals: dict[str, int] = {}
            shared = False
            lightning = self.layout == "lightning"
            for scan in self.files:
                tensors = scan.tensors
                column = list(columns(TENSOR_DTYPE, tensors)) if not lightning else []  # each tensor's dtype, once
                codes = set(column)
                if len(codes) == 1:  # one dtype in the file (a shard of most models): the sums run in C
                    code = codes.pop()
                    if code not in groups:
                        groups[code] = []
                        totals[code] = 0
                    groups[code].append(tensors)
                    totals[code] += sum(map(prod, columns(TENSOR_SHAPE, tensors)))
                    shared = shared or (scan.format not in _UNSHARED and any(
                        storage is not None for storage in set(columns(TENSOR_STORAGE, tensors))))
                    continue
                if 1 < len(codes) <= 4:  # a few dtypes (a quantized shard: I32 and F16): one C pass a dtype
                    for code in dict.fromkeys(column):  # in order of first appearance
                        picked = select(tensors, map(code.__eq__, column))
                        if code not in groups:
                            groups[code] = []
                            totals[code] = 0
                        groups[code].append(picked)
                        totals[code] += sum(map(prod, map(TENSOR_SHAPE, picked)))
                    shared = shared or any(storage is not None for storage in set(columns(TENSOR_STORAGE, tensors)))
                    continue
                loose: dict[str, list[TensorInfo]] = {}  # this file's tensors by dtype, one part each
                for tensor in tensors:
                    if lightning and tensor.name.split(".", 1)[0] in LIGHTNING_STATE_KEYS:
                        continue  # what ``tensors`` leaves out
                    code = tensor.dtype
                    group = loose.get(code)
                    if group is None:
                        group = loose[code] = []
                        if code not in groups:
                            groups[code] = []
                            totals[code] = 0
                        groups[code].append(group)
                    group.append(tensor)
                    totals[code] += prod(tensor.shape)
                    if tensor.storage is not None:
                        shared = True
            tally = self.memo["tally"] = ({code: joined(parts) for code, parts in groups.items()}, totals, shared)
        return tally

    @property
    def parameters(self) -> int:
        return sum(t.numel for t in self.counted_tensors)

    @property
    def bytes(self) -> int:
        return sum(t.nbytes or 0 for t in self.counted_tensors)

    def quantized_codes(self) -> list[str]:
        return sorted(self.by_dtype().keys() & dtypes.QUANTIZED_CODES)


_UNSHARED = frozenset({"safetensors", "gguf"})  # formats with no shared storage: their readers never set one


def group_sets(files: Sequence[FileScan], indexes: Sequence[ShardIndex]) -> list[WeightSet]:
    """Every file and index of one directory, in the set it belongs to (sorted by name)."""
    found: dict[tuple[object, ...], tuple[FileRole, str, list[FileScan], list[ShardIndex]]] = {}
    for scan in files:
        training = scan.training
        role = classify(scan.path, weights=True) if training is None else _training_role(scan, training.layout)
        family = role.format or _READER_FAMILIES.get(scan.format or "", scan.format or "")
        key = (*role.set_key[:3], family, role.variant, role.set_key[5])
        found.setdefault(key, (role, family, [], []))[2].append(scan)
    for index in indexes:
        role = classify(index.path)
        key = (role.role, role.layout, role.stem, role.format, role.variant, True)
        found.setdefault(key, (role, role.format, [], []))[3].append(index)
    _join_single_file_indexes(found)
    sets = [_new_set(role, family, sorted(scans, key=lambda s: s.path), tuple(idx))
            for role, family, scans, idx in found.values()]
    return sorted(sets, key=lambda s: s.name)


def _training_role(scan: FileScan, layout: str) -> FileRole:
    """A training checkpoint (guard.training) is one set of its own, of its layout, whatever its folder's name."""
    name = posixpath.basename(scan.path.rstrip("/")) or scan.path
    return FileRole(name, "training-state", "file", layout, name, scan.format or layout, None, None)


def _join_single_file_indexes(found: dict[tuple[object, ...], tuple[FileRole, str, list[FileScan], list[ShardIndex]]]
                              ) -> None:
    """An index whose one shard is the unsharded file beside it (mlx-lm writes ``model.safetensors.index.json``
    even for a single ``model.safetensors``) belongs to that file's set, not to a set of its own."""
    singles = {(key[:5], posixpath.basename(scans[0].path)): key for key, (_, _, scans, idx) in found.items()
               if len(scans) == 1 and not idx and not key[5]}
    for key, (_, _, scans, idx) in list(found.items()):
        if scans or len(idx) != 1 or not idx[0].weight_map:
            continue
        shards = set(idx[0].weight_map.values())
        target = singles.get((key[:5], shards.pop())) if len(shards) == 1 else None
        if target is not None:
            found[target][3].append(idx[0])
            del found[key]


def _new_set(role: FileRole, family: str, files: list[FileScan], indexes: tuple[ShardIndex, ...]) -> WeightSet:
    sharded = role.kind != "file"
    if sharded:
        name = posixpath.basename(indexes[0].path) if indexes else _shard_pattern(files[0].path)
    else:
        name = posixpath.basename(files[0].path)
    return WeightSet(name, role.role, role.layout, role.stem, family, role.variant, sharded, tuple(files), indexes,
                     claimed_dtype(role), False, {})


def _shard_pattern(path: str) -> str:
    role = classify(path)
    if role.kind == "part":  # consolidated.00.pth, consolidated.01.pth, ...
        return f"{role.stem}.*.{role.name.rpartition('.')[2]}"
    if role.shard is None:
        return posixpath.basename(path)
    number = f"{role.shard[0]:05d}-of-"
    head, _, tail = role.name.rpartition(number)  # the shard's own number is the last: never one in the stem
    return f"{head}*-of-{tail}"


def mark_primary(sets: Sequence[WeightSet], *, diffusers: bool) -> tuple[WeightSet, ...]:
    """The sets, with the primary one marked (see ``choose_primary``)."""
    best = choose_primary(sets, diffusers=diffusers)
    return tuple(ws._replace(primary=True) if ws is best else ws for ws in sets)


def choose_primary(sets: Sequence[WeightSet], *, diffusers: bool) -> WeightSet | None:
    """The default variant, safetensors first, then PyTorch, then Flax, then the other formats.

    Two sets that both claim the default (``model.safetensors`` beside
    ``diffusion_pytorch_model.safetensors``) are settled by the directory's own
    kind (diffusers' config names its class), then by name; the other is a copy.
    """
    candidates = ([s for s in sets if s.role == "weights"] or [s for s in sets if s.role == "adapter"]
                  or [s for s in sets if s.files and s.files[0].training is not None])  # a training checkpoint alone
    if not candidates:
        return None

    def rank(ws: WeightSet) -> tuple[object, ...]:
        layout = LAYOUT_ORDER.index(ws.layout) if ws.layout in LAYOUT_ORDER else len(LAYOUT_ORDER)
        fmt = FORMAT_ORDER.index(ws.format) if ws.format in FORMAT_ORDER else len(FORMAT_ORDER)
        kind = (ws.stem in _DIFFUSERS_STEMS) != diffusers
        readable = not any(scan.tensors for scan in ws.files)
        return (ws.variant is not None, layout, fmt, kind, ws.sharded, readable, ws.name)

    return min(candidates, key=rank)
