"""Output formats.  Each is a view of the same Report; JSON is lossless.

May import the report, findings and dtypes; never the inventory, rules or CLI.

A reporter's module is imported when its format is asked for: a text scan never
loads the SARIF or markdown code.
"""

from __future__ import annotations

from collections.abc import Callable

from guard.lazy import resolve

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: cli/flags.py reads REPORTERS on the hook's line
if TYPE_CHECKING:
    from guard.report import Report

Renderer = Callable[..., str]

# format -> "module:function"
REPORTERS: dict[str, str] = {
    "text": "guard.reporters.text:render_text",
    "json": "guard.reporters.json_report:render_json",
    "sarif": "guard.reporters.sarif:render_sarif",
    "github": "guard.reporters.github:render_github",
    "markdown": "guard.reporters.markdown:render_markdown",
}


def renderer(fmt: str) -> Renderer:
    found: Renderer = resolve(REPORTERS[fmt])
    return found


def render(report: Report, fmt: str, *, color: bool = False) -> str:
    if fmt == "text":
        return renderer("text")(report, color=color)
    return renderer(fmt)(report)
