"""--format sarif: SARIF 2.1.0 for GitHub code scanning (one run, every rule).

Weight files get no `region`: upload-sarif streams every file that has a
`startLine` through a line hasher, and a shard can be tens of GB.  We set
`partialFingerprints` ourselves from (code, path, tensor, weight set): no line
number and no message wording, so code scanning tracks a finding across
commits (a re-worded message or a config.json edited above the flagged line
is the same alert) without anyone reading the weights.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from guard import __version__
from guard.catalogue import RULES, Rule
from guard.findings import Finding
from guard.report import Report
from guard.reporters.github import bounded, workspace_relative

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
MAX_RESULTS = 25_000  # GitHub rejects a run with more
SRCROOT = "%SRCROOT%"


def rule_descriptor(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": f"{rule.code} {rule.name}"},
        "fullDescription": {"text": rule.summary[:1024]},
        "help": {
            "text": f"{rule.summary}\n\nExample: {rule.example}\n\nFix: {rule.fix}",
            "markdown": f"{rule.summary}\n\n**Example:** {rule.example}\n\n**Fix:** {rule.fix}",
        },
        "defaultConfiguration": {"level": rule.severity.value},
        # no security-severity: dtype rules are quality findings, not security alerts
        "properties": {"tags": ["checkpoint", "dtype", rule.needs], "precision": "very-high"},
    }


def artifact_location(path: str) -> dict[str, Any]:
    posix = workspace_relative(path)
    if PurePosixPath(posix).is_absolute():  # outside the repository: an absolute file URI
        return {"uri": "file://" + quote(posix, safe="/")}
    return {"uri": quote(posix, safe="/"), "uriBaseId": SRCROOT}


FINGERPRINT_KEY = "ckptGuardFinding/v1"  # our own, beside the one code scanning reads


def fingerprint(finding: Finding, occurrence: int) -> str:
    """What identifies a finding across commits: rule, file, tensor, weight set (and which repeat of them).

    Never the line or the message: both move when nothing about the finding changed.
    """
    key = "\x1f".join((finding.code, workspace_relative(finding.path), finding.tensor or "", finding.set or "",
                       str(occurrence)))
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16] + ":1"


def result(finding: Finding, rule_index: dict[str, int], occurrence: int) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": artifact_location(finding.path)}
    if finding.line:  # a JSON index or config.json: a real line, cheap to hash
        physical["region"] = {"startLine": int(finding.line)}
    location: dict[str, Any] = {"physicalLocation": physical}
    if finding.tensor:
        location["logicalLocations"] = [{"name": bounded(finding.tensor, 1024), "kind": "member"}]
    stable = fingerprint(finding, occurrence)
    out: dict[str, Any] = {
        "ruleId": finding.code,
        "level": finding.severity.value,
        "message": {"text": bounded(finding.message) or finding.code},
        "locations": [location],
        "partialFingerprints": {"primaryLocationLineHash": stable, FINGERPRINT_KEY: stable},
    }
    if finding.code in rule_index:
        out["ruleIndex"] = rule_index[finding.code]
    if finding.set:
        out["properties"] = {"weightSet": bounded(finding.set, 1024)}
    fixes = sarif_fixes(finding)
    if fixes:
        out["fixes"] = fixes
    return out


def sarif_fixes(finding: Finding) -> list[dict[str, Any]]:
    """A config.json rewrite as SARIF's own fix: each value's region, deleted, and its new text.

    The edits are the scan's byte spans of single-line JSON tokens; columns are code points,
    as the run's ``columnKind`` says.  Weight fixes are not text replacements: only JSON shows them.
    """
    fix = finding.fix
    if fix is None or fix.action != "config-dtype" or fix.safety != "safe" or not fix.writes:
        return []
    replacements = []
    for edit in fix.arguments.get("edits") or []:
        if not isinstance(edit, dict):
            return []
        old, line, column = str(edit.get("old", "")), edit.get("line"), edit.get("column")
        offset, length = edit.get("offset"), edit.get("length")
        if not (isinstance(line, int) and isinstance(column, int) and isinstance(offset, int)
                and isinstance(length, int)) or min(line, column) < 1 or min(offset, length) < 0 or "\n" in old:
            return []  # a report read back from a file: only well-formed edits become fixes
        replacements.append({
            "deletedRegion": {"startLine": line, "startColumn": column, "endLine": line,
                              "endColumn": column + len(old),
                              "byteOffset": offset, "byteLength": length},
            "insertedContent": {"text": str(edit.get("new", ""))},
        })
    if not replacements:
        return []
    return [{"description": {"text": bounded(fix.description)},
             "artifactChanges": [{"artifactLocation": artifact_location(fix.writes[0]),
                                  "replacements": replacements}]}]


def render_sarif(report: Report) -> str:
    rule_index = {rule.code: i for i, rule in enumerate(RULES)}
    findings = report.sorted_findings()
    seen: dict[tuple[str, str, str, str], int] = {}
    results = []
    for finding in findings[:MAX_RESULTS]:
        key = (finding.code, finding.path, finding.tensor or "", finding.set or "")
        seen[key] = seen.get(key, 0) + 1
        results.append(result(finding, rule_index, seen[key] - 1))
    invocation: dict[str, Any] = {"executionSuccessful": True}
    if len(findings) > MAX_RESULTS:
        invocation["toolExecutionNotifications"] = [{
            "level": "warning",
            "message": {"text": f"{len(findings) - MAX_RESULTS} of {len(findings)} findings left out: "
                                f"code scanning accepts {MAX_RESULTS} results per run; "
                                "the JSON report has them all."},
        }]
    log = {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "ckpt-guard",
                "version": report.tool_version or __version__,
                "rules": [rule_descriptor(rule) for rule in RULES],
            }},
            "invocations": [invocation],
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    }
    return json.dumps(log, indent=2, ensure_ascii=True) + "\n"
