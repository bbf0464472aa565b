"""Many tensors with the same change, collapsed into one line: a count and a few names, as a scan's
findings say "N tensor(s) ..., e.g. NAME".

Recasts group by their dtype pair (a bf16 re-save is one line, however many tensors it touched);
reshapes by their shape pair (an embedding and its tied head grow together); changed values into
one line with the worst tensor; added and removed tensors by name pattern (layer numbers as ``*``:
a bias dropped from every layer is one line), or by dtype alone when the patterns do not collapse
(two different models).  Labels hold names and dtype strings from the files: views escape them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from guard.records import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a diff imports none (~3 ms of its ~40)
if TYPE_CHECKING:  # annotations only
    from typing import Any

EXAMPLES = 3
MAX_PATTERN_GROUPS = 6  # added/removed patterns beyond this regroup by dtype
_NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)")


class ChangeGroup(Record):
    kind: str  # "added" | "removed" | "recast" | "reshaped" | "values"
    label: str  # "F32 -> BF16", "[50257, 768] -> [50260, 768]", "h.*.attn.bias F32 [768]"
    count: int  # type: ignore[assignment]  # a field named count shadows tuple.count, as namedtuple allows
    examples: tuple[str, ...]
    worst: str | None = None  # values: the tensor with the largest absolute difference
    max_abs: float | None = None
    max_rel: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label, "count": self.count, "examples": list(self.examples),
                "worst": self.worst, "max_abs": self.max_abs, "max_rel": self.max_rel}


def shape_text(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def name_pattern(name: str) -> str:
    """Layer numbers as ``*``: ``model.layers.7.mlp.bias`` -> ``model.layers.*.mlp.bias``."""
    return _NUMBER.sub("*", name)


def change_groups(change: Any) -> list[ChangeGroup]:
    """A SetChange's changes, collapsed; in the order removed, added, recast, reshaped, values."""
    groups = _by_pattern("removed", change.removed) + _by_pattern("added", change.added)
    recast: dict[str, list[Any]] = {}
    reshaped: dict[str, list[Any]] = {}
    for c in change.changed:
        if "recast" in c.kinds:
            recast.setdefault(f"{c.old.dtype} -> {c.new.dtype}", []).append(c)
        if "reshaped" in c.kinds:
            reshaped.setdefault(f"{shape_text(c.old.shape)} -> {shape_text(c.new.shape)}", []).append(c)
    groups += [_changed("recast", label, items) for label, items in recast.items()]
    groups += [_changed("reshaped", label, items) for label, items in reshaped.items()]
    moved = [c for c in change.changed if c.kinds == ("values",)]
    if moved:
        groups.append(_changed("values", "same dtype and shape", moved))
    return groups


def _changed(kind: str, label: str, items: list[Any]) -> ChangeGroup:
    """A group of TensorChanges; with values compared, its worst tensor and largest differences."""
    figured = [c for c in items if c.max_abs is not None]
    if not figured:
        return ChangeGroup(kind, label, len(items), tuple(c.name for c in items[:EXAMPLES]))
    worst = max(figured, key=lambda c: c.max_abs)
    rels = [c.max_rel for c in figured if c.max_rel is not None]
    return ChangeGroup(kind, label, len(items), tuple(c.name for c in items[:EXAMPLES]), worst.name,
                       worst.max_abs, max(rels) if rels else None)


def _by_pattern(kind: str, tensors: Iterable[Any]) -> list[ChangeGroup]:
    tensors = list(tensors)
    if not tensors:
        return []
    patterns: dict[tuple[str, str, tuple[int, ...]], list[str]] = {}
    for t in tensors:
        patterns.setdefault((name_pattern(t.name), t.dtype, t.shape), []).append(t.name)
    if len(patterns) <= MAX_PATTERN_GROUPS:
        return [ChangeGroup(kind, f"{pattern} {dtype} {shape_text(shape)}" if len(names) > 1 else
                            f"{names[0]} {dtype} {shape_text(shape)}", len(names), tuple(names[:EXAMPLES]))
                for (pattern, dtype, shape), names in patterns.items()]
    by_dtype: dict[str, list[str]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t.name)
    return [ChangeGroup(kind, dtype, len(names), tuple(names[:EXAMPLES])) for dtype, names in by_dtype.items()]
