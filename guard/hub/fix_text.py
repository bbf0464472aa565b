"""What `hub fix` shows: the plan on a terminal, its JSON, and the pull request's description.

Every string that came from the repository (paths, descriptions that quote tensor names,
outcome summaries) is attacker-controlled: the terminal view passes it through
``inert_text``, the markdown through ``md_escape`` (no HTML, no markup, no cell breaks), and
the fenced JSON escapes the characters that could close the fence or open a tag.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from guard import __version__
from guard.reporters import render
from guard.reporters.inert import inert_text
from guard.reporters.markdown import md_escape

if TYPE_CHECKING:
    from guard.hub.fix_result import HubFix
    from guard.report import Report

MAX_CHARS = 60_000  # a Hub message; the parts below are cut to fit
TABLE_BUDGET = 16_000
REPORT_BUDGET = 18_000  # each of the before and after reports


def plan_text(result: HubFix) -> str:
    """The dry run on a terminal: one line per planned fix, what it writes, what waits, what cannot be fixed."""
    plan = result.plan
    enabled = sum(p.enabled for p in plan.fixes)
    out = [f"{inert_text(result.repo_id)} @ {result.sha[:12]}: {enabled} fix(es) to apply, "
           f"{len(plan.fixes) - enabled} waiting for a flag, {len(plan.unfixable)} finding(s) with no fix"]
    for planned in plan.fixes:
        finding = planned.finding
        codes = ", ".join(sorted({f.code for f in planned.findings}))
        where = f"{codes} {inert_text(finding.path)}" if finding else "--add"
        state = "ready" if planned.enabled else f"waits for {planned.waiting_for or planned.fix.flag}"
        out.append(f"  {where}: {inert_text(planned.fix.description, limit=400)} [{planned.fix.safety}; {state}]")
        out += [f"      writes {inert_text(w)}" for w in planned.fix.writes]
    for finding, reason in plan.unfixable:
        out.append(f"  no fix: {finding.code} {inert_text(finding.path)}: {inert_text(reason, limit=400)}")
    for what, reason in plan.not_added:
        out.append(f"  not added: {inert_text(what)}: {inert_text(reason, limit=400)}")
    if result.message:
        out.append(result.message)
    return "\n".join(out) + "\n"


def pr_description(result: HubFix, *, marker: str) -> str:
    """The pull request's text: the fixes' table, the report after and before, a JSON summary, the marker."""
    count = len(result.files)
    intro = (f"ckpt-guard {__version__} proposes fixes for the dtype findings of commit `{result.sha[:12]}`. "
             f"This pull request writes {count} file{'s' if count != 1 else ''}; each was verified after "
             "writing (its dtypes re-read, its bytes or its cast checked). It was opened automatically: "
             "review the report below before merging, or close it to decline.")
    table = _bounded(_fix_rows(result), TABLE_BUDGET, "fix rows")
    left = _left_alone(result)
    after = result.after
    parts = [intro, "", "### Fixes", "", "| finding | fix | writes | result |", "|---|---|---|---|", *table, ""]
    if left:
        parts += ["### Not fixed here", "", *left, ""]
    if after is not None:
        parts += ["### After this pull request", "", _cut(render(after, "markdown"), REPORT_BUDGET), ""]
    parts += [f"<details><summary>Before: commit {result.sha[:12]}</summary>", "",
              _cut(render(result.before, "markdown"), REPORT_BUDGET), "", "</details>", ""]
    parts += ["<details><summary>Machine-readable summary</summary>", "", "```json",
              _fenced_json(_summary(result)), "```", "</details>", "", marker, ""]
    text = "\n".join(parts)
    if len(text) > MAX_CHARS:  # the budgets keep well below; a last guard, the marker kept
        text = text[: MAX_CHARS - len(marker) - 200].rsplit("\n", 1)[0] + "\n\n*(truncated)*\n\n" + marker + "\n"
    return text


def _fix_rows(result: HubFix) -> list[str]:
    rows = []
    for planned in result.plan.fixes:
        if not planned.enabled:
            continue
        finding = planned.finding
        codes = md_escape(", ".join(sorted({f.code for f in planned.findings})), limit=60)
        where = f"{codes} {md_escape(finding.path)}" if finding else "--add"
        outcome = next((o for o in result.outcomes if o.planned == planned), None)
        if outcome is None:
            state = "not applied"
        elif outcome.ok:
            state = "written: " + md_escape(outcome.summary, limit=300)
        else:
            state = "refused: " + md_escape(outcome.error or outcome.summary, limit=300)
        writes = "<br>".join(md_escape(w) for w in planned.fix.writes) or "–"
        rows.append(f"| {where} | {md_escape(planned.fix.description, limit=400)} | {writes} | {state} |")
    return rows


def _left_alone(result: HubFix) -> list[str]:
    lines = []
    for planned in result.plan.fixes:
        if not planned.enabled and planned.finding is not None:
            lines.append(f"- {md_escape(planned.finding.code, limit=20)} {md_escape(planned.finding.path)}: "
                         f"waits for `{md_escape(planned.waiting_for or planned.fix.flag or '?', limit=40)}` "
                         f"({md_escape(planned.fix.description, limit=300)})")
    for finding, reason in result.plan.unfixable:
        lines.append(f"- {md_escape(finding.code, limit=20)} {md_escape(finding.path)}: no mechanical fix: "
                     f"{md_escape(reason, limit=300)}")
    return _bounded(lines, TABLE_BUDGET // 2, "findings")


def _summary(result: HubFix) -> dict[str, Any]:
    def verdict(report: Report | None) -> dict[str, Any] | None:
        if report is None:
            return None
        return {"failed": report.failed, "counts": report.counts(),
                "codes": sorted({f.code for f in report.findings})}

    return {"tool": "ckpt-guard", "version": __version__, "repo": result.repo_id, "base": result.sha,
            "plan": result.plan_hash, "files": sorted(result.files),
            "fixes": [{"code": p.finding.code if p.finding else None, "action": p.fix.action}
                      for p in result.plan.fixes if p.enabled],
            "before": verdict(result.before), "after": verdict(result.after)}


def _fenced_json(value: Any) -> str:
    """JSON that cannot close its fence or open a tag: the risky characters as \\u escapes."""
    text = json.dumps(value, indent=1, ensure_ascii=True)
    for ch in "`<>&":
        text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


def _bounded(lines: list[str], budget: int, what: str) -> list[str]:
    kept: list[str] = []
    used = 0
    for line in lines:
        used += len(line) + 1
        if used > budget:
            return kept + [f"_{len(lines) - len(kept):,} more {what} not shown (a Hub message is limited)._"]
        kept.append(line)
    return kept


def _cut(markdown: str, budget: int) -> str:
    if len(markdown) <= budget:
        return markdown
    kept = markdown[: max(markdown.rfind("\n", 0, budget), 0)]
    if sum(line.startswith("```") for line in kept.splitlines()) % 2:
        kept += "\n```"  # cut inside a fence (the mermaid chart): close it
    return kept + "\n\n*(report truncated to fit a Hub message; `ckpt-guard hub scan " \
                                     "--format json` gives all of it)*\n"
