"""The ChangeReport: what a change did to each model's weight sets, and the findings it brings and ends.

Records only; ``guard.diff.compare`` builds them, ``guard.diff.render`` shows them.  JSON is the
lossless view (``to_json``, versioned): the text, markdown and github views collapse what the JSON
lists tensor by tensor.
"""

from __future__ import annotations

import math

from guard import __version__
from guard.findings import Finding, failing_findings
from guard.records import Record
from guard.report import Report

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a diff imports none (~3 ms of its ~40)
if TYPE_CHECKING:  # annotations only
    from typing import Any

DIFF_VERSION = 1
CHANGE_KINDS = ("recast", "reshaped", "values")  # what can differ between two tensors of one name


class TensorRef(Record):
    name: str
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


class TensorChange(Record):
    """One name on both sides whose dtype, shape or (with ``--values``) bytes differ.

    ``max_abs`` is max |new - old| over the elements both hold; ``max_rel`` is that divided by
    max |old| (the tensor's own scale: an element-wise ratio explodes on values near zero).
    ``overlap`` counts the leading rows compared when only the first dimension changed
    (``resize_token_embeddings`` keeps the old rows); None when the whole tensor was compared.
    """

    name: str
    old: TensorRef
    new: TensorRef
    kinds: tuple[str, ...]  # a subset of CHANGE_KINDS, in that order
    identical: bool | None = None  # the compared elements' bytes are equal; None: values not compared
    max_abs: float | None = None
    max_rel: float | None = None
    overlap: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "old": self.old.to_json(), "new": self.new.to_json(), "kinds": list(self.kinds),
                "identical": self.identical, "max_abs": self.max_abs, "max_rel": self.max_rel,
                "overlap_rows": self.overlap}


class SetTotals(Record):
    tensors: int
    parameters: int  # logical, as the scan report counts them (guard.report.SetSummary)
    bytes: int  # stored
    dtypes: dict[str, int]  # code -> parameters
    format: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"tensors": self.tensors, "parameters": self.parameters, "bytes": self.bytes,
                "dtypes": dict(self.dtypes), "format": self.format}


class SetChange(Record):
    key: str  # the set's name, or "OLD -> NEW" for two lone primaries of other names
    old_name: str | None
    new_name: str | None
    status: str  # "added" | "removed" | "changed" | "unchanged"
    old: SetTotals | None
    new: SetTotals | None
    added: tuple[TensorRef, ...] = ()
    removed: tuple[TensorRef, ...] = ()
    changed: tuple[TensorChange, ...] = ()
    unchanged: int = 0  # same name, dtype and shape (and bytes, when values were compared)
    values_differ: int = 0  # of ``changed``: same dtype and shape, other bytes
    not_compared: int = 0  # of ``unchanged``: same headers, values asked for but not read (not local, not placed)
    unreadable: tuple[str, ...] = ()  # files of either side no reader could read
    common: int = 0  # names on both sides
    note: str | None = None
    unknown: int = 0  # names on one side that the other cannot vouch for: a file of it was unreadable

    @property
    def values_only(self) -> bool:
        """Only values changed: no tensor added, removed, recast or reshaped."""
        return bool(self.values_differ) and not (self.added or self.removed or self.unknown) and all(
            c.kinds == ("values",) for c in self.changed)

    def groups(self) -> list[Any]:
        from guard.diff.groups import change_groups

        return change_groups(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key, "old_name": self.old_name, "new_name": self.new_name, "status": self.status,
            "old": None if self.old is None else self.old.to_json(),
            "new": None if self.new is None else self.new.to_json(),
            "added": [t.to_json() for t in self.added], "removed": [t.to_json() for t in self.removed],
            "changed": [c.to_json() for c in self.changed], "unchanged": self.unchanged,
            "values_differ": self.values_differ, "values_only": self.values_only,
            "not_compared": self.not_compared, "unknown": self.unknown, "unreadable": list(self.unreadable),
            "common": self.common,
            "note": self.note,
        }


class ModelChange(Record):
    key: str  # the model's path under its side's root ("." for the root itself)
    old_path: str | None
    new_path: str | None
    status: str  # "added" | "removed" | "changed" | "unchanged"
    sets: tuple[SetChange, ...] = ()
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "old_path": self.old_path, "new_path": self.new_path, "status": self.status,
                "note": self.note, "sets": [s.to_json() for s in self.sets]}


class ChangeReport(Record):
    old_label: str
    new_label: str
    policy: dict[str, Any]
    models: tuple[ModelChange, ...]
    introduced: tuple[Finding, ...]  # the new side's findings with no match on the old side
    resolved: tuple[Finding, ...]  # the old side's findings with no match on the new side
    old_report: Report
    new_report: Report
    values: bool = False

    @property
    def fail_on(self) -> str:
        return str(self.policy.get("fail_on", "error"))

    @property
    def changed(self) -> bool:
        return any(m.status != "unchanged" for m in self.models)

    def failing(self) -> list[Finding]:
        return failing_findings(self.introduced, self.fail_on)

    @property
    def failed(self) -> bool:
        return bool(self.failing())

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def introduced_report(self) -> Report:
        """The new side's scan with only the findings the change introduces: for annotations and SARIF."""
        return Report(models=list(self.new_report.models), findings=list(self.introduced),
                      policy=dict(self.policy), extra={"diff": {"old": self.old_label, "new": self.new_label}})

    def to_json(self) -> dict[str, Any]:
        """JSON-safe as it is (an infinite difference is the string "inf"): ``json.dumps`` needs no care."""
        sets = [s for m in self.models for s in m.sets]
        return _finite({
            "version": DIFF_VERSION,
            "kind": "ckpt-guard-diff",
            "tool": {"name": "ckpt-guard", "version": __version__},
            "old": self.old_label,
            "new": self.new_label,
            "policy": self.policy,
            "values": self.values,
            "summary": {
                "changed": self.changed,
                "models": len(self.models),
                "models_changed": sum(1 for m in self.models if m.status != "unchanged"),
                "sets_changed": sum(1 for s in sets if s.status != "unchanged"),
                "tensors_added": sum(len(s.added) for s in sets),
                "tensors_removed": sum(len(s.removed) for s in sets),
                "tensors_recast": sum(1 for s in sets for c in s.changed if "recast" in c.kinds),
                "tensors_reshaped": sum(1 for s in sets for c in s.changed if "reshaped" in c.kinds),
                "tensors_values_changed": sum(s.values_differ for s in sets),
                "introduced": len(self.introduced),
                "resolved": len(self.resolved),
                "fail_on": self.fail_on,
                "failed": self.failed,
            },
            "models": [m.to_json() for m in self.models],
            "introduced": [f.to_json() for f in self.introduced],
            "resolved": [f.to_json() for f in self.resolved],
        })


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
