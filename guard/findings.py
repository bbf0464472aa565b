"""Severity and the immutable Finding record."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from guard.fixes import Fix
from guard.records import Record


class Severity(str, enum.Enum):
    """SARIF's words; the GitHub reporter alone maps note -> notice."""

    error = "error"
    warning = "warning"
    note = "note"

    @property
    def rank(self) -> int:
        return {"error": 3, "warning": 2, "note": 1}[self.value]


FAIL_ON_CHOICES = ("error", "warning", "note", "never")


def fail_threshold(fail_on: str) -> int:
    """Minimum severity rank that fails the run; 4 (unreachable) for ``never``."""
    return {"error": 3, "warning": 2, "note": 1, "never": 4}[fail_on]


def failing_findings(findings: Iterable[Finding], fail_on: str) -> list[Finding]:
    """The findings at or above ``fail_on``: what turns exit 0 into 1 (a scan's, or a change's introduced)."""
    threshold = fail_threshold(fail_on)
    return [f for f in findings if f.severity.rank >= threshold]


def shown(name: str, limit: int = 120) -> str:
    """A tensor name quoted for a message; bounded, since names are attacker-controlled.

    The full name stays in ``Finding.tensor``; reporters escape both.
    """
    if len(name) <= limit:
        return repr(name)
    return repr(name[:limit]) + f"…(+{len(name) - limit} chars)"


class Finding(Record):
    code: str
    severity: Severity
    path: str
    message: str
    tensor: str | None = None
    line: int | None = None  # 1-based line inside a JSON file (index, config.json)
    set: str | None = None  # the weight set it was judged in (None: the model, a pipeline, a JSON file)
    fix: Fix | None = None  # planned by the rule that raised it; None until guard.scan attaches the no-fix reason

    def to_json(self) -> dict[str, object]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "path": self.path,
            "tensor": self.tensor,
            "message": self.message,
            "line": self.line,
            "set": self.set,
            "fix": None if self.fix is None else self.fix.to_json(),
        }

    @classmethod
    def from_json(cls, obj: dict[str, object]) -> Finding:
        line = obj.get("line")
        tensor = obj.get("tensor")
        judged_in = obj.get("set")
        return cls(
            code=str(obj["code"]),
            severity=Severity(str(obj["severity"])),
            path=str(obj["path"]),
            message=str(obj["message"]),
            tensor=None if tensor is None else str(tensor),
            line=line if isinstance(line, int) else None,
            set=None if judged_in is None else str(judged_in),
            fix=Fix.from_json(obj.get("fix")),
        )
