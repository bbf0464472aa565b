"""--format github.  (Being written with the CI-surfaces issue.)"""

from __future__ import annotations

from guard.errors import UsageError
from guard.report import Report


def render_github(report: Report) -> str:
    raise UsageError("--format github is not available yet")
