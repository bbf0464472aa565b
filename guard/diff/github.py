"""``diff --format github``: annotations for the findings the change introduces, one notice per
changed weight set saying what changed, and a plain verdict line.

Annotations are the scan's (``guard.reporters.github``: the same escaping, the same cap of ten per
level); the notices use the notice slots the findings leave.
"""

from __future__ import annotations

from guard.diff.change import ChangeReport
from guard.diff.text import totals_text, verdict_line
from guard.reporters.github import PER_LEVEL, annotation, bounded, escape_data, escape_property, workspace_relative
from guard.reporters.inert import inert_text


def render_change_github(change: ChangeReport) -> str:
    from guard.findings import Severity

    findings = sorted(change.introduced, key=lambda f: (-f.severity.rank, f.path, f.code, f.tensor or ""))
    lines: list[str] = []
    for level in Severity:
        lines += [annotation(f) for f in findings if f.severity is level][:PER_LEVEL]
    notes_used = min(PER_LEVEL, sum(1 for f in findings if f.severity is Severity.note))
    lines += _set_notices(change, PER_LEVEL - notes_used)
    lines.append(verdict_line(change))  # our own words first: never an untrusted string at a line start
    return "\n".join(lines) + "\n"


def _set_notices(change: ChangeReport, slots: int) -> list[str]:
    from guard.diff.markdown import what_changed

    out: list[str] = []
    for model in change.models:
        for ws in model.sets:
            if ws.status == "unchanged" or len(out) >= slots:
                continue
            name = ws.new_name or ws.old_name or ws.key
            path = model.new_path or model.old_path or model.key
            file = f"{path.rstrip('/')}/{name}" if path != "." else name
            # the markdown cell's words, unescaped back to plain text for the annotation
            summary = f"{inert_text(ws.key)}: {_plain(what_changed(ws))}; {totals_text(ws.old, ws.new)}"
            props = f"file={escape_property(workspace_relative(file))},title={escape_property('ckpt-guard diff')}"
            out.append(f"::notice {props}::{escape_data(bounded(summary))}")
    return out


def _plain(markdown_cell: str) -> str:
    for entity, char in (("&gt;", ">"), ("&lt;", "<"), ("&#124;", "|"), ("&#96;", "`"), ("&#91;", "["),
                         ("&#93;", "]"), ("&amp;", "&")):
        markdown_cell = markdown_cell.replace(entity, char)
    return markdown_cell
