"""The markdown that ckpt-guard posts on the Hub: PR descriptions, comments, discussions.

The body is the markdown reporter's summary (or, for a push reviewed against
its previous head, the diff's table), cut to fit a Hub message, then a small
fenced JSON block for machines, then a hidden marker naming the scanned commit
so that a redelivered webhook can see it already answered.  Pushes to a branch
are answered in one discussion per branch (``branch_thread_title``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from guard import __version__
from guard.report import Report
from guard.reporters import render

if TYPE_CHECKING:
    from guard.diff import ChangeReport

MAX_CHARS = 60_000  # Hub messages are limited; keep well below
MARKER = "<!-- ckpt-guard:revision={sha} -->"


def marker(sha: str) -> str:
    return MARKER.format(sha=sha)


def discussion_title(sha: str, ref: str) -> str:
    """The title of a per-revision discussion, as reviewers before the branch thread opened them."""
    branch = ref.removeprefix("refs/heads/")
    return f"ckpt-guard: dtype report for {branch} @ {sha[:12]}"


def branch_thread_title(ref: str) -> str:
    """The one discussion per branch: opened by its first reviewed push, commented on by later ones."""
    return f"ckpt-guard: checkpoint reviews of {ref.removeprefix('refs/heads/')}"


def _tail(summary: dict[str, Any], sha: str | None) -> str:
    tail = ("\n<details><summary>Machine-readable summary</summary>\n\n```json\n"
            + json.dumps(summary, indent=1) + "\n```\n</details>\n")
    if sha:
        tail += "\n" + marker(sha) + "\n"
    return tail


def diff_markdown(change: ChangeReport, *, intro: str, sha: str, base: str) -> str:
    """A push reviewed against its previous head: the diff's table, introduced and resolved findings."""
    from guard.diff import render_change_markdown

    summary = {
        "tool": "ckpt-guard", "version": __version__, "revision": sha, "base": base, "failed": change.failed,
        "fail_on": change.policy.get("fail_on"),
        "introduced": sorted({f.code for f in change.introduced}),
        "resolved": sorted({f.code for f in change.resolved}),
        "counts": {"introduced": len(change.introduced), "resolved": len(change.resolved)},
    }
    tail = _tail(summary, sha)
    body = render_change_markdown(change, max_bytes=max(1000, MAX_CHARS - len(intro) - len(tail) - 200))
    return f"{intro}\n\n{body.rstrip()}\n{tail}"


def hub_markdown(report: Report, *, intro: str, sha: str | None = None) -> str:
    summary = {
        "tool": "ckpt-guard", "version": __version__, "revision": sha, "failed": report.failed,
        "fail_on": report.fail_on, "counts": report.counts(),
        "codes": sorted({f.code for f in report.findings}),
    }
    tail = _tail(summary, sha)
    body = render(report, "markdown")
    room = MAX_CHARS - len(intro) - len(tail) - 200
    if len(body) > room:
        cut = body.rfind("\n", 0, room)
        body = body[: max(cut, 0)] + "\n\n*(report truncated to fit a Hub message; `ckpt-guard hub scan "
        body += "--format json` gives all of it)*\n"
    return f"{intro}\n\n{body}{tail}"
