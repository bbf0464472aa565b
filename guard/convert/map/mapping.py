"""The naming step of a conversion, as run.py calls it: mapping, checks, decisions, findings, figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard.convert.map.checks import check_shapes
from guard.convert.map.decisions import head_findings, resolve_aliases
from guard.convert.map.mapped import Mapping, Refusal
from guard.convert.map.naming import map_tensors
from guard.convert.map.restore import restore_counters, restore_tables
from guard.convert.read.source import SourceModel
from guard.findings import Finding


def plan_mapping(source: SourceModel, config: dict[str, Any] | None, *, to: str, src: Path,
                 strict: bool) -> tuple[Mapping, list[Finding], dict[str, Any]]:
    where = str(src / "config.json")
    try:
        mapping = map_tensors(source, config, to=to, where=where)
    except Refusal as exc:
        return Mapping("refused"), [exc.finding], {"mapping": "refused", "next_step": exc.next_step}
    findings = list(mapping.findings)
    if mapping.how != "identity":
        assert config is not None and mapping.architecture is not None
        resolve_aliases(mapping, to=to)
        findings = list(mapping.findings) + head_findings(mapping, strict=strict)
        findings += check_shapes(mapping.tensors, config, architecture=mapping.architecture)
        if to == "torch":
            restore_counters(mapping)
            restore_tables(mapping, config, dtype=_main_float(mapping))
    figures = {"mapping": mapping.how, "architecture": mapping.architecture, "tied": mapping.tied,
               "dropped": mapping.dropped, "decisions": mapping.report(mapping.architecture or to)}
    return mapping, findings, figures


def _main_float(mapping: Mapping) -> str:
    from guard import dtypes

    counts: dict[str, int] = {}
    for m in mapping.tensors:
        if dtypes.is_float(m.source.info.dtype):
            counts[m.source.info.dtype] = counts.get(m.source.info.dtype, 0) + m.source.info.numel
    return max(counts, key=counts.__getitem__) if counts else "F32"
