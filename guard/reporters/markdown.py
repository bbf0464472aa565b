"""--format markdown: the GitHub job summary.

A verdict, a per-model table, the findings table and a mermaid pie chart of
parameters by dtype.  GitHub refuses a step summary over 1 MiB, so the tables
stop at a byte budget well below that and say what they left out.  Every name
is escaped: a tensor called `<img src=x>|**x**` renders as text.
"""

from __future__ import annotations

import re

from guard.dtypes import display_name
from guard.report import Report
from guard.reporters.github import workspace_relative
from guard.reporters.inert import inert_text
from guard.reporters.text import fix_hint, human_bytes, human_count

MODEL_BUDGET = 128 * 1024  # bytes of the models table
FINDING_BUDGET = 384 * 1024  # bytes of the findings table
MAX_FINDING_ROWS = 1000
# entities, not backslashes, where a backslash would leave "](" or a cell break behind
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "&#124;", "`": "&#96;", "[": "&#91;", "]": "&#93;"}
_MD_PUNCT = set("\\*_~!#$")


def md_escape(value: str, *, limit: int = 200) -> str:
    """Text for a table cell: no HTML, no markup, no cell breaks, no newlines."""
    out = []
    for ch in inert_text(value, limit=limit):
        if ch in _MD_ENTITIES:
            out.append(_MD_ENTITIES[ch])
        elif ch in _MD_PUNCT:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _pie_label(code: str) -> str:
    # mermaid labels sit inside double quotes; keep to a safe alphabet
    return re.sub(r"[^A-Za-z0-9_.+() -]", "?", display_name(code))[:40]


def _bounded(rows: list[str], budget: int) -> tuple[list[str], int]:
    kept, used = [], 0
    for row in rows:
        size = len(row.encode("utf-8")) + 1
        if used + size > budget:
            break
        kept.append(row)
        used += size
    return kept, len(rows) - len(kept)


def render_markdown(report: Report) -> str:
    counts = report.counts()
    files = sum(len(m.files) for m in report.models)
    icon, verdict = (":x:", "failed") if report.failed else (":white_check_mark:", "passed")
    if not report.models:  # nothing was checked: never "passed"
        icon, verdict = ((":x:", "failed: no checkpoint files found") if report.failed
                         else (":warning:", "found no checkpoint files"))
    out = [
        f"## {icon} ckpt-guard {verdict}",
        "",
        f"**{counts['error']} error(s)**, {counts['warning']} warning(s), {counts['note']} note(s) "
        f"in {len(report.models)} model(s), {files} file(s) (fail-on: `{md_escape(report.fail_on, limit=10)}`).",
        "",
    ]
    hint = fix_hint(report)  # our own words and counts: nothing in it comes from a checkpoint
    if hint:
        out += [f":wrench: {hint}.", ""]
    if isinstance(report.extra.get("parity"), dict):
        from guard.reporters.parity import parity_markdown

        out += parity_markdown(report.extra["parity"], md_escape)
    out += _models_section(report)
    out += _pie_section(report)
    out += _findings_section(report)
    return "\n".join(out) + "\n"


def _models_section(report: Report) -> list[str]:
    """One row per weight set: a reader sees each model's copies and variants and their dtypes."""
    if not report.models:
        return ["No checkpoint files found.", ""]
    rows = []
    for model in report.models:
        name = md_escape(workspace_relative(model.path))
        extra = [x for x in (
            f"config: {md_escape(model.config_dtype, limit=40)}" if model.config_dtype else "",
            f"quantized: {md_escape(model.quantization.label, limit=60)}" if model.quantization is not None else "",
            f"{model.bits_per_weight:.2f} bits per weight" if model.bits_per_weight else "",
            model.quantization.note if model.quantization is not None else "",
        ) if x]
        sets = model.all_sets
        for ws in sets:
            notes = ", ".join((["primary"] if ws.primary and len(sets) > 1 else [])
                              + ([f"claims {md_escape(display_name(ws.claimed_dtype), limit=20)}"]
                                 if ws.claimed_dtype else []) + [md_escape(n, limit=120) for n in ws.notes]
                             + (extra if ws.primary else []))
            shares = ws.parameter_shares()  # quantized: logical counts, packed payloads as "nf4 (packed)"
            total = sum(shares.values()) or 1
            mix = " · ".join(f"{md_escape(display_name(code), limit=30)} {n / total:.1%}"
                             for code, n in shares.items()) or "–"
            rows.append(f"| {name} | {md_escape(ws.name, limit=120)} | {md_escape(ws.role, limit=20)} "
                        f"| {md_escape(ws.format or '–', limit=20)} | {len(ws.files)} | {mix} "
                        f"| {human_count(ws.parameters)} | {human_bytes(ws.bytes)} | {notes} |")
    kept, left = _bounded(rows, MODEL_BUDGET)
    lines = ["### Models", "",
             "| model | weight set | role | format | files | dtypes (share of parameters) | parameters | bytes "
             "| notes |",
             "|---|---|---|---|---:|---|---:|---:|---|", *kept, ""]
    if left:
        lines += [f"_{left:,} more row(s) not shown to stay under GitHub's 1 MiB summary limit._", ""]
    return lines


def _pie_section(report: Report) -> list[str]:
    """Parameters by dtype, one copy per model: the primary set's counts, never a sum over copies.
    A quantized set counts logically: its packed payloads as "nf4 (packed)", its components not at all."""
    totals: dict[str, int] = {}
    for model in report.models:
        primary = next((ws for ws in model.sets if ws.primary and ws.shares is not None), None)
        counts = primary.parameter_shares() if primary is not None else {
            c: s.parameters for c, s in model.dtypes.items()}
        for code, n in counts.items():
            label = _pie_label(code)
            totals[label] = totals.get(label, 0) + n
    shown = sorted(((n, label) for label, n in totals.items() if n > 0), reverse=True)
    if not shown:
        return []
    slices = [f'    "{label}" : {n}' for n, label in shown[:20]]
    return ["### Parameters by dtype", "", "```mermaid", "pie showData", *slices, "```", ""]


def _findings_section(report: Report) -> list[str]:
    findings = report.sorted_findings()
    if not findings:
        return ["No findings."]
    rows = []
    for f in findings[:MAX_FINDING_ROWS]:
        where = md_escape(workspace_relative(f.path)) + (f":{f.line}" if f.line else "")
        tensor = md_escape(f.tensor, limit=120) if f.tensor else ""
        rows.append(f"| {f.severity.value} | {md_escape(f.code, limit=20)} | {where} | {tensor} "
                    f"| {md_escape(f.message, limit=400)} |")
    kept, left = _bounded(rows, FINDING_BUDGET)
    left += len(findings) - len(rows)
    lines = ["### Findings", "", "| severity | code | file | tensor | message |", "|---|---|---|---|---|", *kept, ""]
    if left:
        lines.append(f"_{left:,} more finding(s) not shown (GitHub caps a step summary at 1 MiB); "
                     f"the JSON report (`--format json`) lists all {len(findings):,}._")
    return lines
