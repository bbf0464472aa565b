"""The scan pipeline: paths -> inventories (weight sets) -> findings -> Report."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from guard.catalogue import RULES_BY_CODE
from guard.config import Policy
from guard.findings import Finding
from guard.fixes import no_fix
from guard.inventory import ModelInventory, discover_models, display_path, load_local_model
from guard.inventory.pipelines import Pipeline, local_pipelines
from guard.report import ModelSummary, Report
from guard.rules import check_model
from guard.rules.variants import check_pipeline


def scan_inventories(
    inventories: Iterable[ModelInventory], policy: Policy, *, values: bool = False,
    pipelines: Sequence[Pipeline] = (), add: Sequence[str] = (),
) -> Report:
    """``add``: `fix --add` requests, planned per model into ``report.extra["add_requests"]``."""
    report = Report(policy=policy.to_json())
    for inv in inventories:
        report.models.append(ModelSummary.from_inventory(inv))
        if add:
            from guard.rules.copies import plan_add_copy

            report.extra.setdefault("add_requests", []).extend(
                {"dir": inv.path, "what": what, "fix": plan_add_copy(inv, what).to_json()} for what in add)
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
    report.findings = [with_fix_field(f) for f in report.sorted_findings()]
    return report


def with_fix_field(finding: Finding) -> Finding:
    """Every finding says whether a fix exists: one a rule planned, or why there is none."""
    if finding.fix is not None:
        return finding
    rule = RULES_BY_CODE.get(finding.code)
    return finding._replace(fix=no_fix(finding.code, rule.fix if rule else "see `ckpt-guard rules`"))


def scan_paths(paths: Iterable[str | os.PathLike[str]], policy: Policy, *, values: bool = False,
               add: Sequence[str] = ()) -> Report:
    models = discover_models(paths)
    pipelines = local_pipelines((m.directory for m in models), display=display_path)
    return scan_inventories((load_local_model(m) for m in models), policy, values=values, pipelines=pipelines,
                            add=add)
