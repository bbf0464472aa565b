"""Report: the lossless result of a run.  JSON is the format; the others are views."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guard import __version__
from guard.findings import Finding, Severity, fail_threshold
from guard.inventory import DtypeStats, ModelInventory

REPORT_VERSION = 1


class ReportFormatError(ValueError):
    pass


@dataclass(frozen=True)
class FileSummary:
    path: str
    format: str | None
    size: int
    tensors: int


@dataclass(frozen=True)
class ModelSummary:
    path: str
    files: tuple[FileSummary, ...]
    dtypes: dict[str, DtypeStats]
    config_dtype: str | None = None
    quantization: str | None = None

    @property
    def parameters(self) -> int:
        return sum(s.parameters for s in self.dtypes.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.dtypes.values())

    @classmethod
    def from_inventory(cls, inv: ModelInventory) -> ModelSummary:
        declared = inv.config_dtypes()
        return cls(
            path=inv.path,
            files=tuple(FileSummary(s.path, s.format, s.size, len(s.tensors)) for s in inv.files),
            dtypes=inv.dtype_summary(),
            config_dtype=declared[0].value if declared else None,
            quantization=inv.quantization(),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "files": [
                {"path": f.path, "format": f.format, "size": f.size, "tensors": f.tensors} for f in self.files
            ],
            "dtypes": {
                code: {"tensors": s.tensors, "parameters": s.parameters, "bytes": s.bytes}
                for code, s in self.dtypes.items()
            },
            "parameters": self.parameters,
            "bytes": self.bytes,
            "config_dtype": self.config_dtype,
            "quantization": self.quantization,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ModelSummary:
        return cls(
            path=str(obj["path"]),
            files=tuple(
                FileSummary(str(f["path"]), f.get("format"), int(f.get("size", 0)), int(f.get("tensors", 0)))
                for f in obj.get("files", [])
            ),
            dtypes={
                str(code): DtypeStats(int(s["tensors"]), int(s["parameters"]), int(s["bytes"]))
                for code, s in obj.get("dtypes", {}).items()
            },
            config_dtype=obj.get("config_dtype"),
            quantization=obj.get("quantization"),
        )


@dataclass
class Report:
    models: list[ModelSummary] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # values / conversion / parity / hub figures
    tool_version: str = __version__

    @property
    def fail_on(self) -> str:
        return str(self.policy.get("fail_on", "error"))

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Severity}
        for finding in self.findings:
            counts[finding.severity.value] += 1
        return counts

    def failing(self) -> list[Finding]:
        threshold = fail_threshold(self.fail_on)
        return [f for f in self.findings if f.severity.rank >= threshold]

    @property
    def failed(self) -> bool:
        return bool(self.failing())

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def sorted_findings(self) -> list[Finding]:
        """Most severe first, then by path and code: the order every view uses."""
        return sorted(self.findings, key=lambda f: (-f.severity.rank, f.path, f.code, f.tensor or ""))

    def to_json(self) -> dict[str, Any]:
        counts = self.counts()
        return {
            "version": REPORT_VERSION,
            "tool": {"name": "ckpt-guard", "version": self.tool_version},
            "policy": self.policy,
            "summary": {
                "models": len(self.models),
                "files": sum(len(m.files) for m in self.models),
                "findings": len(self.findings),
                "errors": counts["error"],
                "warnings": counts["warning"],
                "notes": counts["note"],
                "fail_on": self.fail_on,
                "failed": self.failed,
            },
            "models": [m.to_json() for m in self.models],
            "findings": [f.to_json() for f in self.findings],
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Report:
        if not isinstance(obj, dict) or "findings" not in obj or "models" not in obj:
            raise ReportFormatError("not a ckpt-guard JSON report (no 'models'/'findings')")
        version = obj.get("version")
        if version != REPORT_VERSION:
            raise ReportFormatError(f"report version {version!r} is not supported (expected {REPORT_VERSION})")
        try:
            return cls(
                models=[ModelSummary.from_json(m) for m in obj["models"]],
                findings=[Finding.from_json(f) for f in obj["findings"]],
                policy=dict(obj.get("policy") or {}),
                extra=dict(obj.get("extra") or {}),
                tool_version=str((obj.get("tool") or {}).get("version", __version__)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReportFormatError(f"malformed report: {exc!r}") from None
