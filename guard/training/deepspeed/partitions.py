"""Where each of the model's tensors lives in a ZeRO checkpoint, byte range by byte range.

The rules are ``zero_to_fp32``'s (DeepSpeed 0.19): the masters in ``param_shapes`` order, each group's
rank partitions concatenated (ZeRO-1/2; 0.19.8's per-parameter alignment paddings skipped; the group
aligned to ``2 * world_size`` at its end) or, for ZeRO-3, ``ceil(n / world_size)`` elements of each
parameter from every rank, the padding dropped; frozen parameters from the model states' fragments;
buffers from the module (floating ones upcast to fp32, as ``zero_to_fp32`` does); shared parameters as
aliases.  Sizes that do not add up are CG118 problems, said in ``zero_to_fp32``'s own terms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from guard import dtypes
from guard.records import Record
from guard.tensors import TensorInfo
from guard.training.deepspeed.records import ModelStates, OptimStates


class Piece(Record):
    file: str
    start: int | None  # absolute byte offset in ``file``; None where the scan did not place it (a Hub file)
    numel: int


class Placed(Record):
    """One tensor of the consolidated state dict: its pieces in order (their elements, then ``shape``)."""

    name: str
    dtype: str  # the stored dtype of its pieces
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    kind: str  # "master" | "frozen" | "buffer"
    upcast: bool = False  # a floating buffer written as fp32 (zero_to_fp32's ``.float()``)
    alias_of: str | None = None  # a shared parameter: the same tensor under another name


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


class _Flat:
    """The concatenation of some flat tensors (one per rank, or one per group), addressed by element."""

    def __init__(self, parts: Sequence[TensorInfo]) -> None:
        self.parts = list(parts)
        self.bounds = [0]
        for part in self.parts:
            self.bounds.append(self.bounds[-1] + part.numel)

    @property
    def numel(self) -> int:
        return self.bounds[-1]

    def pieces(self, offset: int, numel: int) -> list[Piece]:
        out, end = [], offset + numel
        for part, lo, hi in zip(self.parts, self.bounds, self.bounds[1:]):
            a, b = max(lo, offset), min(hi, end)
            if a < b:
                start = None if part.data_start is None else part.data_start + (dtypes.nbytes(part.dtype, a - lo) or 0)
                out.append(Piece(part.file, start, b - a))
        return out


def place(model: ModelStates, optims: Sequence[OptimStates],
          fragments: Sequence[ModelStates] = ()) -> tuple[list[Placed], list[str]]:
    """The consolidated tensors and the problems (CG118 messages) found placing them.

    ``optims`` are the ranks' optimizer states in rank order; ``fragments`` the ZeRO-3 model states in
    rank order (their frozen fragments).  Nothing is read: pieces are byte ranges.
    """
    problems: list[str] = []
    placed: list[Placed] = []
    module = {t.name: t for t in model.module}
    for name in model.buffer_names:
        buffer = module.get(name)
        if buffer is not None:
            floating = dtypes.is_float(buffer.dtype)
            placed.append(Placed(name, buffer.dtype, buffer.shape, (Piece(buffer.file, buffer.data_start,
                                                                           buffer.numel),), "buffer",
                                 upcast=floating and buffer.dtype != "F32"))
    stage = optims[0].stage if optims else (model.stage or 0)
    world = len(optims)
    placed += _frozen(model, fragments if stage == 3 else (model,), stage, problems)
    if optims:
        masters = _zero3(model, optims, problems) if stage == 3 else _zero2(model, optims, problems)
        placed += masters
    known = {p.name for p in placed}
    for alias, target in model.shared:
        if target in known:
            source = next(p for p in placed if p.name == target)
            placed.append(source._replace(name=alias, alias_of=target))
    if world and any(o.partition_count != world for o in optims):
        problems.append(f"partition_count is {optims[0].partition_count} but {world} optimizer file(s) are read")
    return placed, problems


def _frozen(model: ModelStates, ranks: Sequence[ModelStates], stage: int, problems: list[str]) -> list[Placed]:
    out = []
    for name, shape in model.frozen_shapes:
        found = [next((t for t in r.frozen_fragments if t.name == name), None) for r in ranks]
        frags = [f for f in found if f is not None]
        if len(frags) != len(found):
            problems.append(f"frozen parameter {name!r} has no fragment in every model states file")
            continue
        flat = _Flat(frags)
        if flat.numel < _numel(shape):
            problems.append(f"frozen parameter {name!r} {list(shape)} needs {_numel(shape):,} elements, "
                            f"its fragments hold {flat.numel:,}")
            continue
        out.append(Placed(name, frags[0].dtype, shape, tuple(flat.pieces(0, _numel(shape))), "frozen"))
    return out


def _zero2(model: ModelStates, optims: Sequence[OptimStates], problems: list[str]) -> list[Placed]:
    world = len(optims)
    out: list[Placed] = []
    groups = len(optims[0].masters)
    if any(len(o.masters) != groups for o in optims) or len(model.param_shapes) != groups:
        problems.append(f"param_shapes has {len(model.param_shapes)} group(s), the partitions "
                        f"{sorted({len(o.masters) for o in optims})}")
        return out
    align = 2 * world
    paddings = optims[0].alignment_paddings
    for g, shapes in enumerate(model.param_shapes):
        flat = _Flat([o.masters[g] for o in optims])
        group_pads = paddings[g] if paddings is not None and g < len(paddings) else None
        if group_pads is not None and len(group_pads) != len(shapes):
            problems.append(f"group {g}: {len(shapes)} parameters but {len(group_pads)} alignment paddings")
            group_pads = None
        offset = 0
        for i, (name, shape) in enumerate(shapes):
            n = _numel(shape)
            if offset + n > flat.numel:
                problems.append(f"group {g}: {name!r} {list(shape)} ends at element {offset + n:,}, past the "
                                f"{flat.numel:,} the {world} partition(s) hold")
                return out
            out.append(Placed(name, optims[0].masters[g].dtype, shape, tuple(flat.pieces(offset, n)), "master"))
            offset += n + (group_pads[i] if group_pads is not None else 0)
        consumed, avail = align * math.ceil(offset / align), align * math.ceil(flat.numel / align)
        if consumed != avail:
            problems.append(f"group {g}: param_shapes consume {consumed:,} elements of the {avail:,} the "
                            f"{world} partition(s) hold")
    return out


def _zero3(model: ModelStates, optims: Sequence[OptimStates], problems: list[str]) -> list[Placed]:
    world = len(optims)
    out: list[Placed] = []
    sizes = [m.numel for m in optims[0].masters]
    if any([m.numel for m in o.masters] != sizes for o in optims):
        problems.append("the ranks' flat partitions differ in size: " +
                        ", ".join(str([m.numel for m in o.masters]) for o in optims[:4]))
        return out
    flats = [_Flat(o.masters) for o in optims]
    offset = 0
    for shapes in model.param_shapes:
        for name, shape in shapes:
            n = _numel(shape)
            part = math.ceil(n / world)
            if offset + part > flats[0].numel:
                problems.append(f"{name!r} {list(shape)} ends at element {(offset + part) * world:,}, past the "
                                f"{flats[0].numel * world:,} the {world} partition(s) hold")
                return out
            pieces = [p for flat in flats for p in flat.pieces(offset, part)]
            out.append(Placed(name, optims[0].masters[0].dtype, shape, tuple(_first(pieces, n)), "master"))
            offset += part
    if offset * world != flats[0].numel * world:
        problems.append(f"param_shapes consume {offset * world:,} elements of the {flats[0].numel * world:,} "
                        f"the {world} partition(s) hold")
    return out


def _first(pieces: list[Piece], numel: int) -> list[Piece]:
    """The pieces covering the first ``numel`` elements (ZeRO-3's padding sits in the last rank's piece)."""
    out, left = [], numel
    for piece in pieces:
        if left <= 0:
            break
        take = min(left, piece.numel)
        if take:
            out.append(piece._replace(numel=take))
        left -= take
    return out
