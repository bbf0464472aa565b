"""The scan pipeline: paths -> inventories (weight sets) -> findings -> Report."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from guard.catalogue import RULES_BY_CODE
from guard.config import Policy
from guard.dtypes import is_float
from guard.findings import Finding
from guard.fixes import no_fix
from guard.inventory import ModelInventory, discover_models, display_path, load_local_model
from guard.inventory.pipelines import Pipeline, local_pipelines
from guard.report import ModelSummary, Report
from guard.rules import check_model
from guard.rules.variants import check_pipeline


def scan_inventories(
    inventories: Iterable[ModelInventory], policy: Policy, *, values: bool = False,
    pipelines: Sequence[Pipeline] = (), add: Sequence[str] = (), publishing: bool | None = False,
) -> Report:
    """``add``: `fix --add` requests, planned per model into ``report.extra["add_requests"]``.
    ``publishing``: the tree is a model repository about to be published or pushed (guard.rules.publishing);
    None: the caller judges that itself, tree by tree (a Hub scan of several repositories)."""
    report = Report(policy=policy.to_json())
    training: list[ModelInventory] = []  # those holding a training checkpoint: CG120-CG122 once all are read
    loadable = False  # whether any model publishes loadable weights (CG121)
    weights: list[tuple[str, str, str]] = []  # each model's primary weights (folder, dtype, file): CG122 at the end
    for inv in inventories:
        if any(ws.files and ws.files[0].training is not None for ws in inv.sets):
            training.append(inv)
        loadable = loadable or any(ws.role in ("weights", "adapter") and ws.files and ws.files[0].training is None
                                   and any(scan.tensors for scan in ws.files) for ws in inv.sets)
        weights.extend(_primary_weights(inv))
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
    published = None
    if training:
        from guard.rules.publishing import PublishingCheck  # imported only where a training checkpoint was read

        published = PublishingCheck(weights=loadable)  # CG120/CG121: judged over the whole tree
        for inv in training:
            published.add(inv)
    if published is not None and publishing is not None:
        report.findings.extend(f for f in published.findings(publishing=publishing)
                               if policy.is_enabled(f.code, f.path))
    if published is not None and published.training and weights and policy.is_enabled("CG122"):
        from guard.training.published import narrower_findings

        report.findings.extend(f for f in narrower_findings(published.training, weights)
                               if policy.is_enabled(f.code, f.path))
    if policy.is_enabled("CG109"):
        for pipeline in pipelines:
            report.findings.extend(f for f in check_pipeline(pipeline) if policy.is_enabled(f.code, f.path))
    report.findings = [with_fix_field(f) for f in report.sorted_findings()]
    return report


def _primary_weights(inv: ModelInventory) -> list[tuple[str, str, str]]:
    """The model's primary weight set as (folder, dominant floating dtype, first file): what CG122 compares."""
    primary = inv.primary
    if primary is None or primary.role != "weights" or not primary.files:
        return []
    floats = {c: n for c, n in primary.parameters_by_dtype().items() if is_float(c)}
    return [(inv.path, max(floats, key=floats.__getitem__), primary.files[0].path)] if floats else []


def with_fix_field(finding: Finding) -> Finding:
    """Every finding says whether a fix exists: one a rule planned, or why there is none."""
    if finding.fix is not None:
        return finding
    rule = RULES_BY_CODE.get(finding.code)
    return finding._replace(fix=no_fix(finding.code, rule.fix if rule else "see `ckpt-guard rules`", path=finding.path,
                                       message=finding.message))


def scan_paths(paths: Iterable[str | os.PathLike[str]], policy: Policy, *, values: bool = False,
               add: Sequence[str] = (), publishing: bool = False, named: bool = True) -> Report:
    """``named``: the user named these paths (not the default "."): a directory that holds no checkpoint is
    CG010, so a gate pointed at the wrong folder fails under ``--fail-on warning`` instead of passing."""
    paths = list(paths)
    models = discover_models(paths)
    pipelines = local_pipelines((m.directory for m in models), display=display_path)
    report = scan_inventories((load_local_model(m) for m in models), policy, values=values, pipelines=pipelines,
                              add=add, publishing=publishing)
    if named and policy.is_enabled("CG010"):
        empty = [f for f in _nothing_found(paths, [m.directory for m in models]) if policy.is_enabled(f.code, f.path)]
        if empty:
            report.findings.extend(with_fix_field(f) for f in empty)
            report.findings = report.sorted_findings()
    return report


def _nothing_found(paths: list[str | os.PathLike[str]], directories: list[str]) -> list[Finding]:
    """CG010 for each named directory no model was found in (a file named is the hook's: never one)."""
    from guard.catalogue import make_finding
    from guard.paths import clean_path

    findings = []
    for raw in paths:
        path = clean_path(raw)
        if not os.path.isdir(path) or any(d == path or _inside(d, path) or _inside(path, d) for d in directories):
            continue
        shown = display_path(path)
        findings.append(make_finding("CG010", shown, "no checkpoint files found in this directory or below it"))
    return findings


def _inside(path: str, root: str) -> bool:
    if root == ".":
        return not path.startswith("/") and path != "."
    return path != root and path.startswith(root.rstrip("/") + "/")
