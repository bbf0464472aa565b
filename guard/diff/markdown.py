"""``diff --format markdown``: the compact table the Action's job summary and the Hub reviewer post.

One row per changed weight set (what changed, in counts; tensors, parameters and bytes before and
after; findings introduced and resolved), then the changes collapsed to one bullet per kind, then
the findings.  Bounded by ``max_bytes`` (a Hub comment, GitHub's 1 MiB summary): each part stops
at its share and says what it left out.  Every name is escaped as the scan's markdown escapes it.
"""

from __future__ import annotations

from guard.diff.change import ChangeReport, SetChange, SetTotals
from guard.diff.text import figures_text
from guard.findings import Finding
from guard.reporters.github import workspace_relative
from guard.reporters.markdown import _bounded, md_escape
from guard.reporters.text import human_bytes, human_count

SHARES = {"table": 0.35, "introduced": 0.3, "changes": 0.25, "resolved": 0.1}
MAX_EXAMPLES = 3


def render_change_markdown(change: ChangeReport, *, heading: str | None = None, max_bytes: int = 60_000) -> str:
    icon, verdict = (":x:", "failed") if change.failed else (":white_check_mark:", "passed")
    changed = sum(1 for m in change.models if m.status != "unchanged")
    out = [heading if heading is not None else f"## {icon} ckpt-guard diff {verdict}", "",
           f"`{md_escape(change.old_label, limit=120)}` → `{md_escape(change.new_label, limit=120)}`: "
           + (f"{changed} of {len(change.models)} model(s) changed" if changed else "no weight changes")
           + f"; **{len(change.introduced)} finding(s) introduced**, {len(change.resolved)} resolved "
           f"(fail-on: `{md_escape(change.fail_on, limit=10)}`).", ""]
    # each part's own header and "more not shown" lines: about 700 bytes together
    budget = max(1000, max_bytes - sum(len(line.encode()) + 1 for line in out) - 768)
    if changed:
        out += _table(change, int(budget * SHARES["table"]))
    out += _findings("Introduced", change.introduced, int(budget * SHARES["introduced"]))
    if changed:
        out += _changes(change, int(budget * SHARES["changes"]))
    out += _findings("Resolved", change.resolved, int(budget * SHARES["resolved"]))
    return "\n".join(out) + "\n"


def _table(change: ChangeReport, budget: int) -> list[str]:
    found = _finding_counts(change)
    rows = []
    for model in change.models:
        for ws in model.sets:
            if ws.status == "unchanged":
                continue
            plus, minus = found.get((model.key, ws.key), (0, 0))
            rows.append(f"| {md_escape(model.key, limit=120)} | {md_escape(ws.key, limit=120)} | {what_changed(ws)} "
                        f"| {_pair(ws.old, ws.new, 'tensors')} | {_pair(ws.old, ws.new, 'parameters')} "
                        f"| {_pair(ws.old, ws.new, 'bytes')} | +{plus} / −{minus} |")
        if model.note:  # config.json's dtype or quantization changed
            rows.append(f"| {md_escape(model.key, limit=120)} | config.json | {_arrows(model.note)} | | | | |")
    kept, left = _bounded(rows, budget)
    lines = ["| model | weight set | change | tensors | parameters | bytes | findings |",
             "|---|---|---|---:|---:|---:|---|", *kept, ""]
    if left:
        lines += [f"_{left:,} more row(s) not shown; `--format json` has them all._", ""]
    return lines


def what_changed(ws: SetChange) -> str:
    if ws.status in ("added", "removed"):
        return f"set {ws.status}"
    recast = sum(1 for c in ws.changed if "recast" in c.kinds)
    reshaped = sum(1 for c in ws.changed if "reshaped" in c.kinds)
    dtypes = sorted({f"{c.old.dtype}→{c.new.dtype}" for c in ws.changed if "recast" in c.kinds})
    parts = [f"+{len(ws.added):,} added" if ws.added else "", f"−{len(ws.removed):,} removed" if ws.removed else "",
             (f"{recast:,} recast" + (f" ({md_escape(dtypes[0], limit=40)})" if len(dtypes) == 1 else "")
              if recast else ""),
             f"{reshaped:,} reshaped" if reshaped else "",
             f"{ws.values_differ:,} values changed" if ws.values_differ else "",
             f"{len(ws.unreadable)} file(s) unreadable" if ws.unreadable else "",
             md_escape(ws.note, limit=160) if ws.note else ""]
    return " · ".join(p for p in parts if p) or "renamed"


def _pair(old: SetTotals | None, new: SetTotals | None, what: str) -> str:
    def one(t: SetTotals | None) -> str:
        if t is None:
            return "–"
        value = getattr(t, what)
        return f"{value:,}" if what == "tensors" else human_count(value) if what == "parameters" else human_bytes(value)

    a, b = one(old), one(new)
    delta = ""
    if what == "parameters" and old is not None and new is not None and old.parameters != new.parameters:
        delta = f" ({new.parameters - old.parameters:+,})"  # a resize hides in the rounded counts
    return (a if a == b else f"{a} → {b}") + delta


def _finding_counts(change: ChangeReport) -> dict[tuple[str, str], tuple[int, int]]:
    """(model key, set key) -> (introduced, resolved), by the sets the findings were judged in."""
    names: dict[tuple[str, str | None, str | None], tuple[str, str]] = {}
    for model in change.models:
        for ws in model.sets:
            names[("new", model.new_path, ws.new_name)] = (model.key, ws.key)
            names[("old", model.old_path, ws.old_name)] = (model.key, ws.key)
    counts: dict[tuple[str, str], list[int]] = {}
    for side, findings, slot in (("new", change.introduced, 0), ("old", change.resolved, 1)):
        for f in findings:
            for (s, path, name), key in names.items():
                if s == side and name == f.set and path is not None and (
                        path == "." or f.path.startswith(path.rstrip("/") + "/")):
                    counts.setdefault(key, [0, 0])[slot] += 1
                    break
    return {k: (v[0], v[1]) for k, v in counts.items()}


def _changes(change: ChangeReport, budget: int) -> list[str]:
    rows = []
    for model in change.models:
        for ws in model.sets:
            if ws.status == "unchanged":
                continue
            where = f"{md_escape(model.key, limit=80)} · {md_escape(ws.key, limit=80)}"
            for g in ws.groups():
                names = ", ".join(f"`{md_escape(n, limit=100)}`" for n in g.examples[:MAX_EXAMPLES])
                more = "" if g.count <= len(g.examples) else " e.g."
                figures = f"; {md_escape(figures_text(g), limit=300)}" if g.max_abs is not None else ""
                rows.append(f"- {where}: **{g.kind}** {_arrows(g.label)} "
                            f"({g.count:,} tensor(s){more} {names}){figures}")
            if ws.values_only:
                rows.append(f"- {where}: only values changed")
    if not rows:
        return []
    kept, left = _bounded(rows, budget)
    lines = ["<details><summary>What changed</summary>", "", *kept]
    if left:
        lines.append(f"- _{left:,} more line(s); `--format json` lists every tensor_")
    return [*lines, "", "</details>", ""]


def _arrows(text: str) -> str:
    """Escaped, with our own " -> " between an old and a new value drawn as an arrow."""
    return " → ".join(md_escape(part, limit=200) for part in text.split(" -> "))


def _findings(title: str, findings: tuple[Finding, ...], budget: int) -> list[str]:
    if not findings:
        return []
    rows = []
    for f in findings:
        where = md_escape(workspace_relative(f.path)) + (f":{f.line}" if f.line else "")
        tensor = md_escape(f.tensor, limit=120) if f.tensor else ""
        rows.append(f"| {f.severity.value} | {md_escape(f.code, limit=20)} | {where} | {tensor} "
                    f"| {md_escape(f.message, limit=300)} |")
    kept, left = _bounded(rows, budget)
    lines = [f"#### {title} ({len(findings)})", "", "| severity | code | file | tensor | message |",
             "|---|---|---|---|---|", *kept, ""]
    if left:
        lines += [f"_{left:,} more not shown; `--format json` lists them all._", ""]
    return lines
