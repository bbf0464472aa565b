"""The views of a ChangeReport: one module per format, loaded when its format is asked for."""

from __future__ import annotations

import json

from guard.diff.change import ChangeReport
from guard.lazy import resolve

# format -> "module:function"
VIEWS: dict[str, str] = {
    "text": "guard.diff.text:render_change_text",
    "json": "guard.diff.render:render_change_json",
    "markdown": "guard.diff.markdown:render_change_markdown",
    "github": "guard.diff.github:render_change_github",
    "sarif": "guard.diff.render:render_change_sarif",
}


def render_change(change: ChangeReport, fmt: str, *, color: bool = False) -> str:
    view = resolve(VIEWS[fmt])
    return str(view(change, color=color) if fmt == "text" else view(change))


def render_change_json(change: ChangeReport) -> str:
    # ensure_ascii keeps hostile names inert for any consumer; to_json already wrote inf as "inf"
    return json.dumps(change.to_json(), indent=2, ensure_ascii=True, allow_nan=False) + "\n"


def render_change_sarif(change: ChangeReport) -> str:
    """Code scanning sees the findings the change introduces, as a scan's SARIF shows them."""
    from guard.reporters import render

    return render(change.introduced_report(), "sarif")
