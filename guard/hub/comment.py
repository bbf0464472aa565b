"""The markdown that ckpt-guard posts on the Hub: PR descriptions, comments, discussions.

The body is the markdown reporter's summary, cut to fit a Hub message, then a
small fenced JSON block for machines, then a hidden marker naming the scanned
commit so that a redelivered webhook can see it already answered.
"""

from __future__ import annotations

import json

from guard import __version__
from guard.report import Report
from guard.reporters import render

MAX_CHARS = 60_000  # Hub messages are limited; keep well below
MARKER = "<!-- ckpt-guard:revision={sha} -->"


def marker(sha: str) -> str:
    return MARKER.format(sha=sha)


def discussion_title(sha: str, ref: str) -> str:
    branch = ref.removeprefix("refs/heads/")
    return f"ckpt-guard: dtype report for {branch} @ {sha[:12]}"


def hub_markdown(report: Report, *, intro: str, sha: str | None = None) -> str:
    summary = {
        "tool": "ckpt-guard", "version": __version__, "revision": sha, "failed": report.failed,
        "fail_on": report.fail_on, "counts": report.counts(),
        "codes": sorted({f.code for f in report.findings}),
    }
    tail = ("\n<details><summary>Machine-readable summary</summary>\n\n```json\n"
            + json.dumps(summary, indent=1) + "\n```\n</details>\n")
    if sha:
        tail += "\n" + marker(sha) + "\n"
    body = render(report, "markdown")
    room = MAX_CHARS - len(intro) - len(tail) - 200
    if len(body) > room:
        cut = body.rfind("\n", 0, room)
        body = body[: max(cut, 0)] + "\n\n*(report truncated to fit a Hub message; `ckpt-guard hub scan "
        body += "--format json` gives all of it)*\n"
    return f"{intro}\n\n{body}{tail}"
