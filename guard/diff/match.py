"""The findings a change introduces and resolves: each side's scan findings, matched across sides.

A finding on one side matches one on the other by (model, weight set, code, tensor), counted as a
multiset, never by message: a message that only changed its count is the same finding.  A finding
of no set and no tensor (config.json, one shard file) is keyed by its file under the model.  Where a
(model, set, code) is left with exactly one unmatched finding on each side, the two are one finding
whose example tensor moved (a set-level finding names its first offender), not one resolved and one
introduced.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

from guard.diff.sides import Side, model_of, relative
from guard.findings import Finding
from guard.report import Report

SetKeys = dict[tuple[str, str, str], tuple[str, str]]  # (side, model path, set name or "") -> (model key, set key)


def match_findings(old: Side, new: Side, old_report: Report, new_report: Report,
                   set_keys: SetKeys) -> tuple[list[Finding], list[Finding]]:
    """(introduced, resolved): the new side's findings without a match, and the old side's."""
    old_keyed = list(_keyed("old", old, old_report.findings, set_keys))
    new_keyed = list(_keyed("new", new, new_report.findings, set_keys))
    return _moved_examples(_unmatched(new_keyed, old_keyed), _unmatched(old_keyed, new_keyed))


def _unmatched(keyed: list[tuple[tuple[object, ...], Finding]],
               other: list[tuple[tuple[object, ...], Finding]]) -> list[tuple[tuple[object, ...], Finding]]:
    """``keyed``'s findings left over once each key of ``other`` has matched one (a multiset difference)."""
    left = Counter(key for key, _ in other)
    out = []
    for key, finding in keyed:
        if left[key] > 0:
            left[key] -= 1
        else:
            out.append((key, finding))
    return out


def _moved_examples(introduced: list[tuple[tuple[object, ...], Finding]],
                    resolved: list[tuple[tuple[object, ...], Finding]]) -> tuple[list[Finding], list[Finding]]:
    """One finding each side of one (model, set, code), tensors differing: the same finding."""
    def where(items: Sequence[tuple[tuple[object, ...], Finding]]) -> Counter[tuple[object, ...]]:
        return Counter(key[:3] for key, _ in items)

    new_counts, old_counts = where(introduced), where(resolved)
    same = {k for k, n in new_counts.items() if n == 1 and old_counts.get(k) == 1}
    return ([f for key, f in introduced if key[:3] not in same], [f for key, f in resolved if key[:3] not in same])


def _keyed(side_name: str, side: Side, findings: Sequence[Finding],
           set_keys: SetKeys) -> Iterator[tuple[tuple[object, ...], Finding]]:
    model_paths = [inv.path for inv in side.inventories]
    for finding in findings:
        model = model_of(finding.path, model_paths)
        model_key = set_key = None
        if model is not None:
            model_key = set_keys.get((side_name, model, ""), (relative(model, side.root), ""))[0]
            if finding.set:
                model_key, set_key = set_keys.get((side_name, model, finding.set), (model_key, finding.set))
        else:
            model_key, set_key = relative(finding.path, side.root), finding.set
        # a finding of no set and no tensor (config.json, a shard file): its file under the model
        where = relative(finding.path, model or side.root) if finding.set is None and finding.tensor is None else None
        yield (model_key, set_key, finding.code, finding.tensor, where), finding
