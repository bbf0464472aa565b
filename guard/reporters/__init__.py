"""Output formats.  Each is a view of the same Report; JSON is lossless."""

from __future__ import annotations

from collections.abc import Callable

from guard.report import Report
from guard.reporters.github import render_github
from guard.reporters.json_report import render_json
from guard.reporters.markdown import render_markdown
from guard.reporters.sarif import render_sarif
from guard.reporters.text import render_text

Renderer = Callable[..., str]

REPORTERS: dict[str, Renderer] = {
    "text": render_text,
    "json": render_json,
    "sarif": render_sarif,
    "github": render_github,
    "markdown": render_markdown,
}


def render(report: Report, fmt: str, *, color: bool = False) -> str:
    if fmt == "text":
        return render_text(report, color=color)
    return REPORTERS[fmt](report)
