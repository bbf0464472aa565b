"""--format markdown.  (Being written with the CI-surfaces issue.)"""

from __future__ import annotations

from guard.errors import UsageError
from guard.report import Report


def render_markdown(report: Report) -> str:
    raise UsageError("--format markdown is not available yet")
