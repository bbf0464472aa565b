"""The scan pipeline: paths -> inventories (weight sets) -> findings -> Report."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from guard.config import Policy
from guard.inventory import ModelInventory, discover_models, display_path, load_local_model
from guard.inventory.pipelines import Pipeline, local_pipelines
from guard.report import ModelSummary, Report
from guard.rules import check_model
from guard.rules.variants import check_pipeline


def scan_inventories(
    inventories: Iterable[ModelInventory], policy: Policy, *, values: bool = False,
    pipelines: Sequence[Pipeline] = (),
) -> Report:
    report = Report(policy=policy.to_json())
    for inv in inventories:
        report.models.append(ModelSummary.from_inventory(inv))
        findings = check_model(inv, policy)
        if values:
            from guard.values.check import value_findings  # needs numpy: the `values` extra

            value_results = value_findings(inv, policy)
            findings.extend(value_results.findings)
            report.extra.setdefault("values", []).extend(value_results.stats)
        report.findings.extend(f for f in findings if policy.is_enabled(f.code, f.path))
    if policy.is_enabled("CG109"):
        for pipeline in pipelines:
            report.findings.extend(f for f in check_pipeline(pipeline) if policy.is_enabled(f.code, f.path))
    report.findings = report.sorted_findings()
    return report


def scan_paths(paths: Iterable[str | os.PathLike[str]], policy: Policy, *, values: bool = False) -> Report:
    models = discover_models(paths)
    pipelines = local_pipelines((m.directory for m in models), display=display_path)
    return scan_inventories((load_local_model(m) for m in models), policy, values=values, pipelines=pipelines)
