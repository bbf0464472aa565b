"""Review a change, not a snapshot: what two versions of the same models differ in.

``sides`` reads a side (local paths; the Hub builds its own from ``guard.hub.scan``), ``compare``
pairs models, weight sets and tensors and matches the two scans' findings, ``values`` compares
tensor data in bounded chunks (``--values``), ``change`` holds the ChangeReport, ``groups``
collapses many tensors with one change into one line, and ``render`` picks a view (text, json,
markdown, github, sarif).  ``textconv`` is the git diff driver's one-line-per-tensor summary.
May import the inventory, scan, report and reporters; never the CLI.
"""

from __future__ import annotations

from guard.diff.change import (
    DIFF_VERSION,
    ChangeReport,
    ModelChange,
    SetChange,
    SetTotals,
    TensorChange,
    TensorRef,
)
from guard.diff.compare import compare_sides
from guard.diff.render import VIEWS, render_change
from guard.diff.sides import Side, local_side


def render_change_markdown(change: ChangeReport, *, heading: str | None = None, max_bytes: int = 60_000) -> str:
    from guard.diff.markdown import render_change_markdown as render

    return render(change, heading=heading, max_bytes=max_bytes)


__all__ = [
    "DIFF_VERSION", "VIEWS", "ChangeReport", "ModelChange", "SetChange", "SetTotals", "Side", "TensorChange",
    "TensorRef", "compare_sides", "local_side", "render_change", "render_change_markdown",
]
