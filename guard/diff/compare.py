"""Two sides -> a ChangeReport: models paired by path, weight sets by name, tensors by name.

Each side is scanned under the same policy (``guard.scan.scan_inventories``); the counts come from
those reports (logical parameters, stored bytes), never recomputed here, and ``guard.diff.match``
matches their findings.  With values, every pair of tensors is collected first and read in one pass
(``guard.diff.values``), so files are compared whole where they can be.
"""

from __future__ import annotations

from guard.config import Policy
from guard.diff.change import ChangeReport, ModelChange, SetChange, SetTotals, TensorChange, TensorRef
from guard.diff.match import SetKeys, match_findings
from guard.diff.sides import Side, relative
from guard.inventory import ModelInventory, WeightSet
from guard.report import ModelSummary, Report, SetSummary
from guard.tensors import TensorInfo

_KINDS = {(False, False): (), (True, False): ("recast",), (False, True): ("reshaped",),
          (True, True): ("recast", "reshaped")}  # (dtype differs, shape differs) -> the header kinds
DIFFERENT_MODELS = 0.5  # fewer names in common than this share of the smaller side: two different models


def compare_sides(old: Side, new: Side, policy: Policy, *, values: bool = False,
                  publishing: bool = False) -> ChangeReport:
    """``publishing``: each side is a model repository as published (the Hub reviewer: CG120/CG121)."""
    from guard.scan import scan_inventories

    if values:
        from guard.diff.values import require_values_extra

        require_values_extra()  # before any work: a missing extra is one line, exit 2
    old_report = scan_inventories(old.inventories, policy, pipelines=old.pipelines, publishing=publishing)
    new_report = scan_inventories(new.inventories, policy, pipelines=new.pipelines, publishing=publishing)
    if values:  # the one value rule a change is judged by: dead weights (cheap: a healthy matrix costs 4 KiB)
        for side, report in ((old, old_report), (new, new_report)):
            _add_dead_weights(side, report, policy)
    builder = _Builder(values)
    models = [builder.model(key, o, n) for key, o, n in pair_models(old, new, old_report, new_report)]
    if values:
        builder.compare_values()
    changes = tuple(builder.finish(m) for m in models)
    introduced, resolved = match_findings(old, new, old_report, new_report, builder.set_keys)
    return ChangeReport(old.label, new.label, policy.to_json(), changes, tuple(introduced), tuple(resolved),
                        old_report, new_report, values)


def _add_dead_weights(side: Side, report: Report, policy: Policy) -> None:
    from guard.scan import with_fix_field
    from guard.values.dead import dead_weight_findings

    found = [f for inv in side.inventories for f in dead_weight_findings(inv) if policy.is_enabled(f.code, f.path)]
    if found:
        report.findings = [with_fix_field(f) for f in report.findings + found]
        report.findings = report.sorted_findings()


Pairing = tuple[ModelInventory, ModelSummary]


def pair_models(old: Side, new: Side, old_report: Report, new_report: Report
                ) -> list[tuple[str, Pairing | None, Pairing | None]]:
    """Models by their path under each side's root; the one model of each side is one model wherever it is,
    and so is a training checkpoint saved at another step (``global_step2/`` against ``global_step4/``)."""
    olds = {relative(inv.path, old.root): (inv, s) for inv, s in zip(old.inventories, old_report.models)}
    news = {relative(inv.path, new.root): (inv, s) for inv, s in zip(new.inventories, new_report.models)}
    only_old, only_new = [k for k in olds if k not in news], [k for k in news if k not in olds]
    pairs: list[tuple[str, Pairing | None, Pairing | None]] = []
    lone = len(olds) == len(news) == 1 and len(only_old) == 1  # one model each side, under other paths
    moved = {} if lone else _other_steps(only_old, only_new, olds, news)
    for key in sorted(olds.keys() | news.keys()):
        if lone and key == only_old[0]:
            label = key if key == only_new[0] else f"{key} -> {only_new[0]}"
            pairs.append((label, olds[key], news[only_new[0]]))
        elif lone and key == only_new[0]:
            continue
        elif key in moved:
            pairs.append((f"{key} -> {moved[key]}", olds[key], news[moved[key]]))
        elif key not in olds and key in moved.values():
            continue
        else:
            pairs.append((key, olds.get(key), news.get(key)))
    return pairs


def _other_steps(only_old: list[str], only_new: list[str], olds: dict[str, Pairing], news: dict[str, Pairing]
                 ) -> dict[str, str]:
    """Old key -> new key for the training checkpoints of one folder saved at other steps: the Trainer's
    ``checkpoint-N/`` holds ``global_stepN/``, a DeepSpeed save folder its tags.  Paired only where the folder
    has exactly one unpaired training-state model of one layout on each side; otherwise nothing is guessed."""
    def groups(keys: list[str], side: dict[str, Pairing]) -> dict[tuple[str, str], list[str]]:
        found: dict[tuple[str, str], list[str]] = {}
        for key in keys:
            primary = side[key][0].primary
            if primary is not None and primary.role == "training-state" and primary.files[0].training is not None:
                found.setdefault((key.rpartition("/")[0], primary.layout), []).append(key)
        return found

    old_groups, new_groups = groups(only_old, olds), groups(only_new, news)
    return {o[0]: new_groups[group][0] for group, o in old_groups.items()
            if len(o) == 1 and len(new_groups.get(group, ())) == 1}


def pair_sets(old: ModelInventory | None, new: ModelInventory | None
              ) -> list[tuple[str, WeightSet | None, WeightSet | None]]:
    """Sets by name; the two primaries of other names (``a.safetensors`` against ``b.safetensors``,
    a ``.bin`` re-saved as ``.safetensors``) are one set.  Where each primary is its side's own folder (a
    DCP or ZeRO checkpoint diffed as ``step-100/`` against ``step-200/``), its name is the folder the user
    named, not a path in the repository: the pair keeps the old name, and the names are no change."""
    olds = {ws.name: ws for ws in (old.sets if old else ())}
    news = {ws.name: ws for ws in (new.sets if new else ())}
    o_primary, n_primary = (old.primary if old else None), (new.primary if new else None)
    names = sorted(olds.keys() | news.keys())
    if o_primary is None or n_primary is None or o_primary.name in news or n_primary.name in olds:
        return [(name, olds.get(name), news.get(name)) for name in names]  # no rename
    assert old is not None and new is not None  # each primary is its side's inventory's
    roots = is_root_set(old, o_primary) and is_root_set(new, n_primary)
    pairs: list[tuple[str, WeightSet | None, WeightSet | None]] = []
    for name in names:
        if name == o_primary.name:
            key = name if roots else f"{name} -> {n_primary.name}"
            pairs.append((key, o_primary, n_primary))
        elif name != n_primary.name:
            pairs.append((name, olds.get(name), news.get(name)))
    return pairs


def is_root_set(inventory: ModelInventory, ws: WeightSet) -> bool:
    """The set is the scanned folder itself (a training checkpoint read as one file named by its folder)."""
    return bool(ws.files) and all(f.path == inventory.path for f in ws.files)


# The two drafts below are internal and never leave this module: plain slotted classes, not records
# (a record is a namedtuple built at import, about as much as the rest of this module's import).
class _TensorPair:
    __slots__ = ("name", "old", "new", "kinds", "ticket")

    def __init__(self, name: str, old: TensorInfo, new: TensorInfo, kinds: tuple[str, ...],
                 ticket: int | None) -> None:
        self.name, self.old, self.new = name, old, new
        self.kinds = kinds  # from the headers: "recast", "reshaped"
        self.ticket = ticket  # its place in the values batch


class _SetDraft:
    """A set pair's header comparison, waiting for the values batch."""

    __slots__ = ("key", "old", "new", "old_totals", "new_totals", "added", "removed", "pairs", "unknown",
                 "unreadable", "note")

    def __init__(self, key: str, old: WeightSet | None, new: WeightSet | None, old_totals: SetTotals | None,
                 new_totals: SetTotals | None, added: tuple[TensorRef, ...], removed: tuple[TensorRef, ...],
                 pairs: tuple[_TensorPair, ...], unknown: int, unreadable: tuple[str, ...],
                 note: str | None) -> None:
        self.key, self.old, self.new = key, old, new
        self.old_totals, self.new_totals = old_totals, new_totals
        self.added, self.removed, self.pairs = added, removed, pairs
        self.unknown = unknown  # names one side cannot vouch for: a file of it was unreadable
        self.unreadable, self.note = unreadable, note


class _Builder:
    """Builds the changes; with values, collects every pair first and reads them all at once."""

    def __init__(self, values: bool) -> None:
        self.values = values
        self.pending: list[tuple[TensorInfo, TensorInfo]] = []
        self.results: list[object] = []
        self.set_keys: SetKeys = {}

    def model(self, key: str, old: Pairing | None, new: Pairing | None
              ) -> tuple[str, Pairing | None, Pairing | None, list[_SetDraft]]:
        for side, pairing in (("old", old), ("new", new)):
            if pairing is not None:
                self.set_keys[(side, pairing[0].path, "")] = (key, "")  # the model's own findings
        drafts = []
        for set_key, o_ws, n_ws in pair_sets(old[0] if old else None, new[0] if new else None):
            if o_ws is not None and old is not None:
                self.set_keys[("old", old[0].path, o_ws.name)] = (key, set_key)
            if n_ws is not None and new is not None:
                self.set_keys[("new", new[0].path, n_ws.name)] = (key, set_key)
            drafts.append(self._draft(set_key, o_ws, n_ws, _summary(old, o_ws), _summary(new, n_ws)))
        return key, old, new, drafts

    def _draft(self, key: str, old: WeightSet | None, new: WeightSet | None, old_sum: SetSummary | None,
               new_sum: SetSummary | None) -> _SetDraft:
        o_tensors, n_tensors = _by_name(old), _by_name(new)
        o_unknown, n_unknown = _unvouched(old), _unvouched(new)
        # one walk over each side's names: the names of one side only, then the pairs
        only_new = [t for name, t in n_tensors.items() if name not in o_tensors]
        only_old = [t for name, t in o_tensors.items() if name not in n_tensors]
        added = tuple(_ref(t) for t in only_new if not o_unknown(t.name))
        removed = tuple(_ref(t) for t in only_old if not n_unknown(t.name))
        unknown = len(only_new) - len(added) + len(only_old) - len(removed)
        pairs = []
        pending = self.pending if self.values else None
        for name, o in o_tensors.items():
            n = n_tensors.get(name)
            if n is None:
                continue
            recast, reshaped = o.dtype != n.dtype, o.shape != n.shape
            kinds = _KINDS[recast, reshaped]
            ticket = None
            if pending is not None:
                ticket = len(pending)
                pending.append((o, n))
            pairs.append(_TensorPair(name, o, n, kinds, ticket))
        unreadable = tuple(s.path for ws in (old, new) if ws is not None for s in ws.files if s.format is None)
        return _SetDraft(key, old, new, _totals(old_sum), _totals(new_sum), added, removed, tuple(pairs), unknown,
                         unreadable, _set_note(old, new, len(o_tensors), len(n_tensors), len(pairs)))

    def compare_values(self) -> None:
        from guard.diff.values import compare_values, locate

        self.results = list(compare_values(locate(self.pending)))

    def finish(self, built: tuple[str, Pairing | None, Pairing | None, list[_SetDraft]]) -> ModelChange:
        key, old, new, drafts = built
        changes = tuple(self._finish_set(d) for d in drafts)
        notes = []
        if old and new:
            for what, before, after in (("config dtype", old[1].config_dtype, new[1].config_dtype),
                                        ("quantization", _quant_label(old[1].quantization),
                                         _quant_label(new[1].quantization))):
                if before != after:
                    notes.append(f"{what} {before or 'none'} -> {after or 'none'}")
        status = "added" if old is None else "removed" if new is None else \
            "changed" if notes or any(s.status != "unchanged" for s in changes) else "unchanged"
        return ModelChange(key, old[0].path if old else None, new[0].path if new else None, status, changes,
                           "; ".join(notes) or None)

    def _finish_set(self, d: _SetDraft) -> SetChange:
        changed: list[TensorChange] = []
        unchanged = values_differ = not_compared = 0
        for pair in d.pairs:
            result = self.results[pair.ticket] if pair.ticket is not None and self.results else None
            identical = getattr(result, "identical", None)
            kinds = pair.kinds
            if identical is False and not kinds:
                kinds = ("values",)
                values_differ += 1
            if kinds:
                figures = (identical, getattr(result, "max_abs", None), getattr(result, "max_rel", None),
                           getattr(result, "overlap", None))
                changed.append(TensorChange(pair.name, _ref(pair.old), _ref(pair.new), kinds, *figures))
            else:
                unchanged += 1
                not_compared += 1 if self.values and identical is None else 0
        old, new = d.old, d.new
        if old is None or new is None:
            status = "added" if old is None else "removed"
        else:
            moved = old.name != new.name and d.key == old.name  # each its side's own folder (pair_sets)
            differs = changed or d.added or d.removed or d.unknown or d.unreadable or old.format != new.format \
                or (old.name != new.name and not moved)
            status = "changed" if differs else "unchanged"
        return SetChange(d.key, old.name if old else None, new.name if new else None, status, d.old_totals,
                         d.new_totals, d.added, d.removed, tuple(changed), unchanged, values_differ,
                         not_compared, d.unreadable, len(d.pairs), d.note, d.unknown)


def _set_note(old: WeightSet | None, new: WeightSet | None, n_old: int, n_new: int, common: int) -> str | None:
    if old is None or new is None:
        return None
    smaller = min(n_old, n_new)
    if smaller and common < DIFFERENT_MODELS * smaller:
        return (f"the two sides hold different models: {common:,} of {n_old:,} old and {n_new:,} new tensor "
                "names in common")
    if old.format != new.format:
        return f"format {old.format or '?'} -> {new.format or '?'}"
    return None


def _quant_label(quant: object) -> str | None:
    """A model's quantization in a few words (a record: method, bits, group size; older reports: text)."""
    if quant is None or isinstance(quant, str):
        return quant
    bits, group = getattr(quant, "bits", None), getattr(quant, "group_size", None)
    return " ".join(str(x) for x in (getattr(quant, "method", "quantized"), f"{bits}-bit" if bits else "",
                                     f"group {group}" if group else "") if x)


def _summary(side: Pairing | None, ws: WeightSet | None) -> SetSummary | None:
    if side is None or ws is None:
        return None
    return next((s for s in side[1].sets if s.name == ws.name), None)


def _totals(summary: SetSummary | None) -> SetTotals | None:
    if summary is None:
        return None
    return SetTotals(sum(s.tensors for s in summary.dtypes.values()), summary.parameters, summary.bytes,
                     {code: s.parameters for code, s in summary.dtypes.items()}, summary.format)


def _by_name(ws: WeightSet | None) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for t in (ws.tensors if ws is not None else ()):
        out.setdefault(t.name, t)
    return out


def _ref(t: TensorInfo) -> TensorRef:
    return TensorRef(t.name, t.dtype, tuple(t.shape))


def _unvouched(ws: WeightSet | None):
    """Whether this side cannot say if it holds a name: a file of the set was unreadable (its tensors
    are unknown, not removed); with a shard index, only the names it places in such a file."""
    bad = {s.path.rpartition("/")[2] for s in ws.files if s.format is None} if ws is not None else set()
    if ws is None or not bad:
        return lambda name: False
    maps = [i.weight_map for i in ws.indexes if i.weight_map]
    if not maps:
        return lambda name: True
    return lambda name: any(m.get(name) in bad for m in maps)
