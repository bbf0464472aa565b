"""ModelInventory: one model directory's weight sets, shard indexes and config.json."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from guard import dtypes
from guard.catalogue import make_finding
from guard.findings import Finding
from guard.inventory.conventions import EXTENSION_FORMATS, UNSUPPORTED_SUFFIXES, classify
from guard.inventory.sets import WeightSet, choose_primary, group_sets
from guard.inventory.stats import ConfigDtype, DtypeStats, ShardIndex
from guard.tensors import FileScan, TensorInfo

CONFIG_NAME = "config.json"
PIPELINE_INDEX = "model_index.json"  # diffusers: the pipeline root names its components
MAX_JSON_BYTES = 64 * 1024 * 1024  # index/config files are small; refuse to slurp a huge one


def is_weight_file(name: str) -> bool:
    """Weights by suffix: every format a reader handles, and those CG006 reports."""
    ext = name.rpartition(".")[2].lower() if "." in name else ""
    return ext in EXTENSION_FORMATS or ext in UNSUPPORTED_SUFFIXES


def is_index_file(name: str) -> bool:
    return classify(name).kind == "index"


@dataclass
class ModelInventory:
    path: str  # the model directory, as displayed
    files: list[FileScan] = field(default_factory=list)
    indexes: list[ShardIndex] = field(default_factory=list)
    config_path: str | None = None
    config: dict[str, object] | None = None
    config_text: str = ""
    findings: list[Finding] = field(default_factory=list)  # inventory-level (bad JSON, ...)
    sets: list[WeightSet] = field(default_factory=list)

    @property
    def primary(self) -> WeightSet | None:
        return next((s for s in self.sets if s.primary), None)

    @property
    def tensors(self) -> Iterator[TensorInfo]:
        """Every tensor of every file (value scans read all copies); rules go set by set."""
        for scan in self.files:
            yield from scan.tensors

    def dtype_summary(self) -> dict[str, DtypeStats]:
        """The primary set's: the model-level counts are one copy's, never a sum over copies."""
        primary = self.primary
        return primary.dtype_summary() if primary is not None else {}

    def config_dtypes(self) -> list[ConfigDtype]:
        if not isinstance(self.config, dict):
            return []
        found: list[ConfigDtype] = []
        _collect_config_dtypes(self.config, "", found, depth=0)
        return [
            ConfigDtype(item.key, item.value, _line_of(self.config_text, item.key.rsplit(".", 1)[-1],
                                                      item.value))
            for item in found
        ]

    def quantization(self, ws: WeightSet | None = None) -> str | None:
        """A short description if the set (default: the primary) is quantized: reported as such, not as errors."""
        if isinstance(self.config, dict) and isinstance(self.config.get("quantization_config"), dict):
            if ws is None or ws.primary or ws.format in ("safetensors", "torch"):
                method = self.config["quantization_config"].get("quant_method", "quantized")
                return str(method)
        ws = ws if ws is not None else self.primary
        low = ws.quantized_codes() if ws is not None else []
        return "+".join(dtypes.display_name(c) for c in low) if low else None

    @property
    def is_diffusers(self) -> bool:
        return isinstance(self.config, dict) and ("_diffusers_version" in self.config or "_class_name" in self.config)


def _collect_config_dtypes(obj: dict[str, object], prefix: str, out: list[ConfigDtype], *, depth: int) -> None:
    if depth > 8:
        return
    for key, value in obj.items():
        if key in ("torch_dtype", "dtype") and isinstance(value, str):
            out.append(ConfigDtype(prefix + key, value, None))
        elif isinstance(value, dict) and key != "quantization_config":
            _collect_config_dtypes(value, f"{prefix}{key}.", out, depth=depth + 1)


def _line_of(text: str, key: str, value: str | None = None) -> int | None:
    """1-based line of ``"key"`` (optionally followed by the value) in a JSON text."""
    pattern = re.escape(json.dumps(key)) + r"\s*:"
    if value is not None:
        pattern += r"\s*" + re.escape(json.dumps(value))
    match = re.search(pattern, text)
    if match is None:
        return None
    return text.count("\n", 0, match.start()) + 1


def line_in_json(text: str, key: str) -> int | None:
    return _line_of(text, key)


def build_inventory(
    path: str,
    weight_scans: Iterable[FileScan],
    *,
    json_files: Mapping[str, bytes | None],
) -> ModelInventory:
    """Assemble an inventory from already-read weight files and small JSON files.

    ``json_files`` maps display paths of index files and config.json to their
    bytes (None where the file could not be read).  Local and Hub scans share
    this, so the same files give the same sets and findings either way.
    """
    inv = ModelInventory(path=path, files=sorted(weight_scans, key=lambda s: s.path))
    for name, data in sorted(json_files.items()):
        base = os.path.basename(name)
        parsed, text = _parse_json(name, data, inv.findings)
        if base == CONFIG_NAME:
            inv.config_path = name
            inv.config_text = text
            if parsed is not None and not isinstance(parsed, dict):
                inv.findings.append(make_finding("CG001", name, "config.json is not a JSON object"))
            elif parsed is not None:
                inv.config = parsed
        elif is_index_file(base):
            index = ShardIndex(name, text=text)
            weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
            if parsed is None:
                pass  # CG001 above; the index still stands for its set
            elif not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
            ):
                inv.findings.append(make_finding(
                    "CG004", name, "shard index has no valid \"weight_map\" (tensor name -> shard file)"))
            else:
                index.weight_map = weight_map
            inv.indexes.append(index)
    inv.sets = group_sets(inv.files, inv.indexes)
    choose_primary(inv.sets, diffusers=inv.is_diffusers)
    return inv


def _parse_json(name: str, data: bytes | None, findings: list[Finding]) -> tuple[object | None, str]:
    if data is None:
        findings.append(make_finding("CG001", name, "file could not be read"))
        return None, ""
    try:
        text = data.decode("utf-8")
        return json.loads(text), text
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        findings.append(make_finding("CG001", name, f"not valid JSON: {reason}"))
        return None, ""
