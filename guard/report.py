"""Report: the lossless result of a run.  JSON is the format; the others are views."""

from __future__ import annotations

from guard import __version__, dtypes
from guard.findings import Finding, Severity, failing_findings
from guard.inventory import DtypeStats, ModelInventory, WeightSet
from guard.inventory.quantization import Quantization, bits_per_weight, logical_by_dtype, logical_parameters
from guard.records import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (~3 ms, the hook's path)
if TYPE_CHECKING:  # annotations only
    from typing import Any

REPORT_VERSION = 2  # 2: models carry their weight sets, findings the set they were judged in
READABLE_VERSIONS = (1, 2)


class ReportFormatError(ValueError):
    pass


class FileSummary(Record):
    path: str
    format: str | None
    size: int
    tensors: int
    unsupported: str | None = None  # CG006: the format no reader handles; the file was not scanned


class SetSummary(Record):
    name: str
    role: str
    layout: str
    variant: str | None
    format: str
    files: tuple[str, ...]
    dtypes: dict[str, DtypeStats]
    primary: bool = False
    claimed_dtype: str | None = None
    quantized: bool = False
    notes: tuple[str, ...] = ()  # what the files say of themselves: ONNX graph I/O, GGUF file type, ...
    logical: int | None = None  # the logical parameter count (quantized: what the full-precision model counts)
    bits_per_weight: float | None = None  # quantized: stored bits over logical parameters
    # quantized: logical parameters by label (dtype code, or "nf4 (packed)" for the payloads; components
    # not at all), summing to ``parameters``: the reports' shares and pie chart read these
    shares: dict[str, int] | None = None

    @property
    def parameters(self) -> int:
        return self.logical if self.logical is not None else count_parameters(self.dtypes, quantized=self.quantized)

    @property
    def elements(self) -> int:
        return sum(s.parameters for s in self.dtypes.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.dtypes.values())

    @classmethod
    def from_set(cls, ws: WeightSet, *, inv: ModelInventory) -> SetSummary:
        files = tuple(p for s in ws.files for p in (s.path, *(_beside(s.path, c) for c in s.companions)))
        quantized = inv.quantization(ws) is not None
        return cls(ws.name, ws.role, ws.layout, ws.variant, ws.format, files,
                   ws.dtype_summary(), ws.primary, ws.claimed_dtype, quantized, set_notes(ws),
                   logical_parameters(inv, ws) if quantized else None,
                   bits_per_weight(inv, ws) if quantized else None,
                   logical_by_dtype(inv, ws) if quantized else None)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "role": self.role, "layout": self.layout, "variant": self.variant,
            "format": self.format, "primary": self.primary, "claimed_dtype": self.claimed_dtype,
            "quantized": self.quantized, "notes": list(self.notes), "files": list(self.files),
            "parameters": self.parameters,
            "bytes": self.bytes,
            "bits_per_weight": self.bits_per_weight,
            "dtypes": _dtypes_json(self.dtypes),
            **({"parameters_by_label": dict(self.shares)} if self.shares is not None else {}),
        }

    def parameter_shares(self) -> dict[str, int]:
        """Parameters by label: a quantized set's logical ones, else each dtype's stored elements."""
        if self.shares is not None:
            return self.shares
        return {code: s.parameters for code, s in self.dtypes.items()}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SetSummary:
        return cls(str(obj["name"]), str(obj.get("role", "weights")), str(obj.get("layout", "file")),
                   obj.get("variant"), str(obj.get("format", "")), tuple(str(f) for f in obj.get("files", [])),
                   _dtypes_from_json(obj.get("dtypes", {})), bool(obj.get("primary")), obj.get("claimed_dtype"),
                   bool(obj.get("quantized")), tuple(str(n) for n in obj.get("notes", [])),
                   _logical(obj), obj.get("bits_per_weight"), _shares(obj.get("parameters_by_label")))


# FileScan.metadata key -> how the summary says it (the files' own word on their dtypes)
_NOTES = (("onnx.input_dtypes", "graph inputs {}"), ("onnx.output_dtypes", "graph outputs {}"),
          ("general.file_type", "GGUF file type {}"), ("declared_dtype_source", "{}"),
          # a training checkpoint (guard.training.state.TrainingState.notes): who wrote it, where its dtypes live
          ("training.what", "{}"), ("training.publishes", "{}"), ("training.dtypes", "{}"), ("training.items", "{}"),
          ("training.files", "{}"))


def set_notes(ws: WeightSet) -> tuple[str, ...]:
    """ONNX graph input/output dtypes (whether keep_io_types was used), a GGUF file type, a Keras policy."""
    notes: list[str] = []
    for key, template in _NOTES:
        value = next((scan.metadata[key] for scan in ws.files if key in scan.metadata), None)
        if value:
            notes.append(template.format(value[:120]))
    return tuple(notes)


def _beside(path: str, name: str) -> str:
    folder = path.rpartition("/")[0]
    return f"{folder}/{name}" if folder else name


def count_parameters(stats: dict[str, DtypeStats], *, quantized: bool) -> int:
    """What the libraries call parameters: floating tensors' elements.  Integer and bool buffers
    (position_ids, num_batches_tracked) are not parameters; a quantized model's packed integer
    payloads are."""
    return sum(s.parameters for code, s in stats.items() if quantized or dtypes.is_float(code))


def _logical(obj: dict[str, Any]) -> int | None:
    """A report's own parameter count, read back as written (a quantized set's is its logical count)."""
    value = obj.get("parameters")
    return value if isinstance(value, int) and obj.get("quantized", obj.get("quantization")) else None


def _shares(obj: object) -> dict[str, int] | None:
    if not isinstance(obj, dict):
        return None
    return {str(k): v for k, v in obj.items() if isinstance(v, int) and not isinstance(v, bool)}


def _dtypes_json(stats: dict[str, DtypeStats]) -> dict[str, Any]:
    return {code: s.to_json() for code, s in stats.items()}


def _dtypes_from_json(obj: dict[str, Any]) -> dict[str, DtypeStats]:
    return {str(code): DtypeStats(int(s["tensors"]), int(s["parameters"]), int(s["bytes"])) for code, s in obj.items()}


class ModelSummary(Record):
    path: str
    files: tuple[FileSummary, ...]
    dtypes: dict[str, DtypeStats]
    config_dtype: str | None = None
    quantization: Quantization | None = None
    sets: tuple[SetSummary, ...] = ()
    logical: int | None = None  # quantized: the primary set's logical parameter count
    bits_per_weight: float | None = None

    @property
    def parameters(self) -> int:
        if self.logical is not None:
            return self.logical
        return count_parameters(self.dtypes, quantized=self.quantization is not None)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.dtypes.values())

    @property
    def all_sets(self) -> tuple[SetSummary, ...]:
        """The weight sets; a version-1 report had none, so its dtypes stand as one."""
        if self.sets:
            return self.sets
        return (SetSummary(self.path, "weights", "file", None, "", tuple(f.path for f in self.files), self.dtypes,
                           primary=True, quantized=self.quantization is not None),)

    @classmethod
    def from_inventory(cls, inv: ModelInventory) -> ModelSummary:
        declared = inv.config_dtypes()
        primary = inv.primary
        quantization = inv.quantization()
        counted = primary if quantization is not None else None  # the set the logical figures count
        return cls(
            path=inv.path,
            files=tuple(FileSummary(s.path, s.format, s.size, len(s.tensors), s.metadata.get("unsupported"))
                        for s in inv.files),
            dtypes=inv.dtype_summary(),
            config_dtype=declared[0].value if declared else None,
            quantization=quantization,
            sets=tuple(SetSummary.from_set(ws, inv=inv) for ws in inv.sets),
            logical=logical_parameters(inv, counted) if counted is not None else None,
            bits_per_weight=bits_per_weight(inv, counted) if counted is not None else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "files": [
                {"path": f.path, "format": f.format, "size": f.size, "tensors": f.tensors,
                 "unsupported": f.unsupported} for f in self.files
            ],
            "dtypes": _dtypes_json(self.dtypes),
            "parameters": self.parameters,
            "bytes": self.bytes,
            "bits_per_weight": self.bits_per_weight,
            "config_dtype": self.config_dtype,
            "quantization": self.quantization.to_json() if self.quantization is not None else None,
            "sets": [ws.to_json() for ws in self.sets],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ModelSummary:
        return cls(
            path=str(obj["path"]),
            files=tuple(
                FileSummary(str(f["path"]), f.get("format"), int(f.get("size", 0)), int(f.get("tensors", 0)),
                            f.get("unsupported"))
                for f in obj.get("files", [])
            ),
            dtypes=_dtypes_from_json(obj.get("dtypes", {})),
            config_dtype=obj.get("config_dtype"),
            quantization=Quantization.from_json(obj.get("quantization")),  # a string before the record
            sets=tuple(SetSummary.from_json(ws) for ws in obj.get("sets", [])),  # version 1 had none
            logical=_logical(obj),
            bits_per_weight=obj.get("bits_per_weight"),
        )


class Report:
    """The result of a run; mutable while it is assembled (models and findings are appended)."""

    def __init__(self, models: list[ModelSummary] | None = None, findings: list[Finding] | None = None,
                 policy: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
                 tool_version: str = __version__) -> None:
        self.models: list[ModelSummary] = [] if models is None else models
        self.findings: list[Finding] = [] if findings is None else findings
        self.policy: dict[str, Any] = {} if policy is None else policy
        self.extra: dict[str, Any] = {} if extra is None else extra  # values / conversion / parity / hub figures
        self.tool_version = tool_version

    def __repr__(self) -> str:
        return f"Report({len(self.models)} model(s), {len(self.findings)} finding(s))"

    @property
    def fail_on(self) -> str:
        return str(self.policy.get("fail_on", "error"))

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Severity}
        for finding in self.findings:
            counts[finding.severity.value] += 1
        return counts

    def failing(self) -> list[Finding]:
        return failing_findings(self.findings, self.fail_on)

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
                "not_scanned": sum(1 for m in self.models for f in m.files if f.unsupported),
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
        if version not in READABLE_VERSIONS:
            raise ReportFormatError(f"report version {version!r} is not supported (expected one of "
                                    f"{', '.join(map(str, READABLE_VERSIONS))})")
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
