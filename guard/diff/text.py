"""``diff --format text``: per model and weight set, one line per kind of change, then the findings.

Every string from a checkpoint (names, paths, dtype strings) goes through ``inert_text``.
"""

from __future__ import annotations

from guard.reporters.inert import inert_text

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a diff imports none (~3 ms of its ~40)
if TYPE_CHECKING:  # annotations only: an unchanged model prints neither groups nor totals
    from guard.diff.change import ChangeReport, ModelChange, SetChange, SetTotals
    from guard.diff.groups import ChangeGroup
    from guard.findings import Finding

MARKS = {"removed": "-", "added": "+", "recast": "~", "reshaped": "~", "values": "~"}
MAX_GROUPS = 12  # lines of changes per set; the JSON lists every tensor
MAX_FINDINGS = 50


def render_change_text(change: ChangeReport, *, color: bool = False) -> str:
    lines = [f"ckpt-guard diff: {inert_text(change.old_label)} -> {inert_text(change.new_label)}"]
    for model in change.models:
        lines += model_lines(model, values=change.values)
    lines += _findings("introduced", change.introduced) + _findings("resolved", change.resolved)
    lines.append(verdict_line(change, color=color))
    return "\n".join(lines) + "\n"


def model_lines(model: ModelChange, *, values: bool) -> list[str]:
    head = f"model {inert_text(model.key)}: {model.status}"
    if model.note:
        head += f" ({inert_text(model.note, limit=300)})"
    if model.status == "unchanged":
        tensors = sum(s.unchanged for s in model.sets)
        return [f"{head}, {tensors:,} tensor(s){' with identical values' if values else ''}"]
    lines = [head]
    for ws in model.sets:
        lines += ["  " + line for line in set_lines(ws, values=values)]
    return lines


def set_lines(ws: SetChange, *, values: bool) -> list[str]:
    lines = [f"{inert_text(ws.key)}: {ws.status}"]
    if ws.note:
        lines.append(f"  note: {inert_text(ws.note, limit=300)}")
    lines.append("  " + totals_text(ws.old, ws.new))
    if ws.status == "unchanged":
        return lines
    groups = ws.groups()
    lines += ["  " + group_text(g) for g in groups[:MAX_GROUPS]]
    if len(groups) > MAX_GROUPS:
        lines.append(f"  ... {len(groups) - MAX_GROUPS} more group(s) of changes (--format json lists every tensor)")
    if ws.old is not None and ws.new is not None and ws.unchanged:
        lines.append("  = " + unchanged_text(ws, values=values))
    if ws.unknown:
        lines.append(f"  ? {ws.unknown:,} tensor(s) unknown: a file of one side is unreadable, so whether they "
                     "were removed or added cannot be told")
    if ws.values_only:
        lines.append("  only values changed: every tensor kept its name, dtype and shape")
    for path in ws.unreadable[:5]:
        lines.append(f"  ! {inert_text(path)}: unreadable (see its finding); its tensors are not compared")
    return lines


def totals_text(old: SetTotals | None, new: SetTotals | None) -> str:
    from guard.reporters.text import human_bytes, human_count  # a changed set's line only

    def side(t: SetTotals | None, what: str) -> str:
        if t is None:
            return "-"
        value = getattr(t, what)
        return f"{value:,}" if what == "tensors" else human_count(value) if what == "parameters" else human_bytes(value)

    parts = [f"{what} {side(old, what)} -> {side(new, what)}" for what in ("tensors", "parameters", "bytes")]
    if old is not None and new is not None and old.parameters != new.parameters:
        parts[1] += f" ({new.parameters - old.parameters:+,})"  # a resize hides in the rounded counts
    return ", ".join(parts)


def group_text(group: ChangeGroup) -> str:
    names = ", ".join(inert_text(n, limit=120) for n in group.examples)
    more = ": " if group.count <= len(group.examples) else ", e.g. "
    label = inert_text(group.label, limit=200)
    text = f"{MARKS[group.kind]} {group.kind} {label} ({group.count:,} tensor(s){more}{names})"
    if group.max_abs is not None:
        text += f"; {figures_text(group)}"
    return text


def figures_text(group: ChangeGroup) -> str:
    if group.kind == "reshaped" and group.max_abs == 0.0:
        return "the rows both sides hold are identical"
    if group.max_abs == 0.0:
        return "every value kept exactly"  # a widening cast (bf16 -> fp32)
    rel = f", max rel {group.max_rel:.3g}" if group.max_rel is not None else ""
    where = f" in {inert_text(group.worst, limit=120)}" if group.worst and group.count > 1 else ""
    return f"max abs {group.max_abs:.3g}{where}{rel}"


def unchanged_text(ws: SetChange, *, values: bool) -> str:
    text = f"{ws.unchanged:,} tensor(s) unchanged"
    if not values:
        text += " (same name, dtype and shape; values not compared: --values)"
    elif ws.not_compared:
        text += (f" ({ws.unchanged - ws.not_compared:,} with identical bytes; {ws.not_compared:,} not compared: "
                 "bytes not placed by the headers, or not a local file)")
    else:
        text += " (identical bytes)"
    return text


def _findings(kind: str, findings: tuple[Finding, ...]) -> list[str]:
    if not findings:
        return []
    lines = [f"findings {kind} ({len(findings)}):"]
    for f in findings[:MAX_FINDINGS]:
        where = inert_text(f.path) + (f":{f.line}" if f.line else "")
        lines.append(f"  {where}: {f.code} [{f.severity.value}] {inert_text(f.message, limit=600)}")
    if len(findings) > MAX_FINDINGS:
        lines.append(f"  ... {len(findings) - MAX_FINDINGS} more (--format json lists them all)")
    return lines


def verdict_line(change: ChangeReport, *, color: bool = False) -> str:
    changed = sum(1 for m in change.models if m.status != "unchanged")
    verdict = "FAILED" if change.failed else "passed"
    if color:
        verdict = f"\x1b[{'31' if change.failed else '32'}m{verdict}\x1b[0m"
    what = f"{changed} of {len(change.models)} model(s) changed" if changed else "no weight changes"
    return (f"ckpt-guard diff: {verdict}: {what}; {len(change.introduced)} finding(s) introduced, "
            f"{len(change.resolved)} resolved (fail-on: {change.fail_on})")
