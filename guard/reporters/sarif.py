"""--format sarif.  (Being written with the CI-surfaces issue.)"""

from __future__ import annotations

from guard.errors import UsageError
from guard.report import Report


def render_sarif(report: Report) -> str:
    raise UsageError("--format sarif is not available yet")
