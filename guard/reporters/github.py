"""--format github: workflow commands the Actions runner turns into annotations.

Every property and message is escaped exactly as the runner unescapes it
(actions/toolkit command.ts), so a hostile tensor name stays inside its own
command.  GitHub shows 10 annotations per level per step; the rest would be
dropped silently, so we emit the most severe first and end with one notice
that says how many more there are and where they are.
"""

from __future__ import annotations

import os
from pathlib import Path

from guard.catalogue import RULES_BY_CODE
from guard.findings import Finding, Severity
from guard.report import Report

PER_LEVEL = 10  # visible annotations per level per step
MAX_MESSAGE = 4000  # characters; GitHub cuts long annotations anyway, and a name can be 1 MB
COMMAND = {Severity.error: "error", Severity.warning: "warning", Severity.note: "notice"}


def escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def workspace_relative(path: str) -> str:
    """A POSIX path relative to $GITHUB_WORKSPACE (else the working directory).

    Report paths are relative to the directory the scan ran in, which may be a
    sub-directory of the repository (the action's `working-directory`).
    """
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if not workspace:
        return Path(path).as_posix()
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(os.path.abspath(workspace)).as_posix()
    except ValueError:
        return Path(path).as_posix()


def annotation(finding: Finding) -> str:
    rule = RULES_BY_CODE.get(finding.code)
    title = f"{finding.code} {rule.name}" if rule else finding.code
    props = [f"file={escape_property(workspace_relative(finding.path))}"]
    if finding.line:
        props.append(f"line={int(finding.line)}")
    props.append(f"title={escape_property(title)}")
    message = bounded(f"{finding.code}: {finding.message}")  # never empty: the runner drops those
    return f"::{COMMAND[finding.severity]} {','.join(props)}::{escape_data(message)}"


def bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else f"{text[:limit]}…(+{len(text) - limit:,} chars)"


def render_github(report: Report) -> str:
    findings = report.sorted_findings()
    per_level = {level: [f for f in findings if f.severity is level] for level in Severity}
    overflow = any(len(items) > PER_LEVEL for items in per_level.values())
    lines: list[str] = []
    for level, items in per_level.items():
        # the closing "more findings" notice needs one of the notice slots itself
        cap = PER_LEVEL - 1 if overflow and level is Severity.note else PER_LEVEL
        lines.extend(annotation(f) for f in items[:cap])
    if len(lines) < len(findings):
        lines.append(overflow_notice(report, shown=len(lines)))
    counts = report.counts()
    verdict = "FAILED" if report.failed else "passed"
    if not report.models:  # nothing was checked: never "passed"
        verdict = "FAILED: no checkpoint files found" if report.failed else "no checkpoint files found"
    # a plain log line: it starts with our own text, never with an untrusted string
    lines.append(
        f"ckpt-guard: {verdict}: {counts['error']} error(s), {counts['warning']} warning(s), "
        f"{counts['note']} note(s) in {len(report.models)} model(s) (fail-on: {report.fail_on})"
    )
    return "\n".join(lines) + "\n"


def overflow_notice(report: Report, *, shown: int) -> str:
    more = len(report.findings) - shown
    message = (
        f"{more:,} more finding(s) not annotated: GitHub shows {PER_LEVEL} annotations per level per step. "
        "All findings are in the job summary and the JSON report (the action's `report` output; "
        "`ckpt-guard scan --format json`)."
    )
    return f"::notice title={escape_property('ckpt-guard: more findings')}::{escape_data(message)}"
