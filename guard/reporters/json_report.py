"""--format json: the lossless, versioned result."""

from __future__ import annotations

import json

from guard.report import Report


def render_json(report: Report) -> str:
    # ensure_ascii keeps hostile names inert for any consumer (escaped as \uXXXX)
    return json.dumps(report.to_json(), indent=2, ensure_ascii=True) + "\n"
