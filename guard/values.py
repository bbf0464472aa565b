"""Value checks (scan --values): CG201-CG204.  (Being written with the conversion issue.)"""

from __future__ import annotations

from typing import Any, NamedTuple

from guard.config import Policy
from guard.errors import UsageError
from guard.findings import Finding
from guard.inventory import ModelInventory


class ValueResults(NamedTuple):
    findings: list[Finding]
    stats: list[dict[str, Any]]  # per-tensor figures, carried in the JSON report's extra["values"]


def value_findings(inv: ModelInventory, policy: Policy) -> ValueResults:
    raise UsageError("scan --values is not available yet")
