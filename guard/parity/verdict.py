"""Which passes are compared, by which rule, and the CG302 finding a failed comparison gives.

- ``fp32`` (torch:fp32 vs flax:fp32): both sides' stored weights upcast bit-exactly, judged by
  transformers' fp32 bound.  For bf16/fp16 weights this is the sharpest check of the conversion.
- for bf16/fp16 weights, ``flax vs fp32 reference`` (torch:fp32 vs flax:stored) is judged
  against PyTorch's own error in the same dtype (``guard.parity.relative``); that yardstick,
  ``torch vs fp32 reference``, and ``stored dtype`` (torch:stored vs flax:stored) are reported.
"""

from __future__ import annotations

from typing import Any

from guard.catalogue import make_finding
from guard.findings import Finding

LOW_PRECISION = ("BF16", "F16")


def low_dtype(stored: dict[str, str]) -> str | None:
    """The dtype both low-precision passes compute in: the narrower side's (bf16 before fp16)."""
    return next((code for code in LOW_PRECISION if code in stored.values()), None)


def compare_runs(runs: dict[str, dict[str, Any]], stored: dict[str, str], *, layers: int,
                 modules: dict[str, dict[str, Any]] | None = None, blocks: list[str] | None = None,
                 ) -> list[dict[str, Any]]:
    """``modules``/``blocks``: the streamed runs' per-module outputs (``guard.parity.located``); absent
    when the models ran whole."""
    from guard.parity import located as pl, metrics as pm, relative as pr

    tol = pm.tolerance_for(layers=layers)
    ref, fp32 = runs["torch:fp32"], runs["flax:fp32"]
    outputs = {name: pm.compare_output(name, ref[name], fp32[name], tie=tol.max_rel) for name in ref if name in fp32}
    where = None
    if modules is not None and blocks is not None:
        where = pl.locate(pl.module_figures(modules["torch:fp32"], modules["flax:fp32"], tol=tol), blocks)
    comparisons = [fixed_comparison("fp32", "torch:fp32", "flax:fp32", outputs, tol, where)]
    low = low_dtype(stored)
    if low is None or "torch:stored" not in runs or "flax:stored" not in runs:
        return comparisons
    rule = pr.rule_for((low,))
    torch_low, flax_low = runs["torch:stored"], runs["flax:stored"]
    outputs = pr.low_precision_outputs(ref, flax_low, torch_low, rule)
    where = None
    if modules is not None and blocks is not None and {"torch:stored", "flax:stored"} <= set(modules):
        where = pl.locate(pl.module_figures(modules["torch:fp32"], modules["flax:stored"],
                                            own=modules["torch:stored"], rule=rule), blocks)
    comparisons.append(_comparison(
        "flax vs fp32 reference", "torch:fp32", "flax:stored", outputs, pr.judge_low_precision(outputs, rule),
        {"rule": "relative", "dtype": rule.dtype, "factor": rule.factor, "floor": rule.floor,
         "agreement_floor": rule.agreement_floor, "source": rule.source}, where))
    for label, a, b in (("torch vs fp32 reference", "torch:fp32", "torch:stored"),
                        ("stored dtype", "torch:stored", "flax:stored")):
        outputs = {name: pm.compare_output(name, runs[a][name], runs[b][name], tie=0.0)
                   for name in runs[a] if name in runs[b]}
        comparisons.append(_comparison(label, a, b, outputs, None, None))
    return comparisons


def fixed_comparison(name: str, ref: str, other: str, outputs: dict[str, Any], tol: Any,
                     located: dict[str, Any] | None = None) -> dict[str, Any]:
    """A comparison judged by a fixed bound (``guard.parity.metrics.Tolerance``): the fp32 passes."""
    from guard.parity import metrics as pm

    return _comparison(name, ref, other, outputs, pm.judge(outputs, tol),
                       {"rule": "fixed", "dtype": tol.dtype, "max_rel": tol.max_rel, "source": tol.source}, located)


def _comparison(name: str, ref: str, other: str, outputs: dict[str, Any],
                failures: list[tuple[str, str, float, float]] | None,
                tolerance: dict[str, Any] | None, located: dict[str, Any] | None = None) -> dict[str, Any]:
    """``failures`` None: reported, not judged (the yardstick and the stored-vs-stored figures).
    ``located``: the block verdict of a streamed run; a block out of bound fails the comparison too."""
    comparison = {"name": name, "reference": ref, "other": other, "judged": failures is not None,
                  "passed": not failures and not (located and located["failing_blocks"]), "tolerance": tolerance,
                  "outputs": outputs,
                  "failures": [{"output": o, "metric": m, "value": v, "threshold": t} for o, m, v, t in failures or ()]}
    if located is not None:
        comparison["located"] = located
    return comparison


def comparison_findings(comparisons: list[dict[str, Any]], *, where: str) -> list[Finding]:
    from guard.parity.located import clause

    findings = []
    for comp in comparisons:
        if not comp["judged"] or comp["passed"]:
            continue
        located = comp.get("located")
        if not comp["failures"]:  # every output within bound, but a block is not
            assert located is not None  # set whenever failures is empty (the worker's comparison)
            first = located["first"]
            findings.append(make_finding("CG302", where, (
                f"{comp['name']} ({comp['reference']} vs {comp['other']}): block {first['module']!r} max_rel = "
                f"{first['max_rel']:.3g} exceeds {first['bound']:.3g}; {located['failing_blocks']} failing "
                f"block(s), every model output within bound")))
            continue
        first, tol = comp["failures"][0], comp["tolerance"]
        output, metric, value, threshold = first["output"], first["metric"], first["value"], first["threshold"]
        if tol["rule"] == "relative":
            fig = comp["outputs"][output]
            own = {"max_rel": fig.get("own_max_rel"), "disagreement": 1 - fig.get("own_agreement", 1.0),
                   "top1_disagreement": 1 - fig.get("own_top1_tie_aware", 1.0)}.get(metric)
            floor = tol["agreement_floor"] if "disagreement" in metric else tol["floor"]
            why = (f" = {tol['factor']:g} x PyTorch's own {own:.3g} + {floor:.3g}" if own is not None else "")
            bound = f"{tol['dtype']} rule: Flax within {tol['factor']:g}x PyTorch's own {tol['dtype']} error"
        else:
            why, bound = "", f"{tol['dtype']} bound: {tol['source']}"
        findings.append(make_finding("CG302", where, (
            f"{comp['name']} ({comp['reference']} vs {comp['other']}): {metric} = {value:.3g} on {output!r} "
            f"exceeds {threshold:.3g}{why} ({bound}); {len(comp['failures'])} failing output(s){clause(located)}")))
    return findings
