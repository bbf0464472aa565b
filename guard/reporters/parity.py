"""The parity summary in text and markdown: per comparison its rule, per judged output both errors.

For a bf16/fp16 model a reader sees *why* it passed or failed: Flax's error against the PyTorch
fp32 reference, PyTorch's own error in the same dtype, their ratio and the bound they make.  The
JSON report (``extra.parity``) has every figure; these are views of it.  Output names come from
the model's own output classes, still kept inert.
"""

from __future__ import annotations

from typing import Any

from guard.reporters.inert import inert_text


def rule_text(tol: dict[str, Any] | None) -> str:
    if not tol:
        return "reported, not judged"
    if tol.get("rule") == "relative":
        return (f"{tol['dtype']}: Flax within {tol['factor']:g}x PyTorch's own error + {tol['floor']:.3g} "
                "of the output's scale")
    return f"bound {tol['max_rel']:.0e}"


def output_rows(comp: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """(output, Flax's error, PyTorch's own error, ratio, bound, verdict) for a judged low-precision
    comparison; a discrete output shows disagreement shares instead of max_rel."""
    failing = {f["output"] for f in comp.get("failures", [])}
    rows = []
    for name, fig in comp["outputs"].items():
        if "own_max_rel" not in fig:
            continue
        verdict = "FAIL" if name in failing else "ok"
        if "agreement" in fig:
            tol = comp["tolerance"]
            allowed = tol["factor"] * (1 - fig["own_agreement"]) + tol["agreement_floor"]
            rows.append((name, f"{1 - fig['agreement']:.1%} off", f"{1 - fig['own_agreement']:.1%} off",
                         _ratio(1 - fig["agreement"], 1 - fig["own_agreement"]), f"{allowed:.1%}", verdict))
            continue
        flax, own = f"{fig['max_rel']:.2e}", f"{fig['own_max_rel']:.2e}"
        if "own_top1_tie_aware" in fig:
            flax += f" top-1 {fig['top1_tie_aware']:.0%}"
            own += f" top-1 {fig['own_top1_tie_aware']:.0%}"
        ratio = "-" if fig.get("ratio") is None else f"{fig['ratio']:.3g}"
        rows.append((name, flax, own, ratio, f"{fig['bound']:.2e}", verdict))
    return rows


def _ratio(flax: float, own: float) -> str:
    return f"{flax / own:.3g}" if own > 0 else "-"


def parity_text(figures: dict[str, Any]) -> str:
    lines = [f"parity {inert_text(str(figures.get('torch_dir')))} vs {inert_text(str(figures.get('flax_dir')))}"
             f" ({inert_text(str(figures.get('torch_class', '-')))} / "
             f"{inert_text(str(figures.get('flax_class', '-')))}, seed {figures.get('seed')})"]
    for comp in figures.get("comparisons", []):
        outputs = [o for o in comp["outputs"].values() if "max_rel" in o]
        worst = max((o["max_rel"] for o in outputs), default=0.0)
        mark = ("ok  " if comp["passed"] else "FAIL") if comp.get("judged", True) else "    "
        lines.append(f"  {comp['name']:<26} {mark} max rel {worst:.2e} ({rule_text(comp.get('tolerance'))})")
        rows = output_rows(comp)
        if rows:
            lines.append(f"    {'output':<32} {'flax':>22} {'pytorch (own)':>22} {'ratio':>7} {'bound':>9}")
            lines += [f"    {inert_text(o, limit=32):<32} {f:>22} {t:>22} {r:>7} {b:>9} {v}"
                      for o, f, t, r, b, v in rows]
    lines += [f"  {line}" for line in tree_lines(figures)]
    drift = drift_text(figures)
    if drift:
        lines.append(f"  {drift}")
    return "\n".join(lines) + "\n\n"


def tree_lines(figures: dict[str, Any]) -> list[str]:
    """``parity --against``: per load of the stack, how its parameters compare with the file's bits."""
    lines = []
    for label, load in (figures.get("loads") or {}).items():
        tree = load.get("tree")
        if tree is None:
            lines.append(f"{inert_text(label, limit=40)}: could not load ({inert_text(str(load.get('error')))})")
            continue
        lines.append(f"{inert_text(label, limit=40)}: {tree['exact']} parameter(s) bit-exact, {len(tree['widened'])} "
                     f"widened exactly, {len(tree['changed'])} changed, {len(tree['missing'])} missing, "
                     f"{len(tree['extra'])} not from the file, {len(tree['unplaced'])} without a place")
    return lines


def drift_text(figures: dict[str, Any]) -> str | None:
    """One line: where JAX ran and, where measured, its fp32 drift at the default matmul precision."""
    backend = figures.get("jax_backend")
    drift = figures.get("default_precision_drift")
    if not backend or (backend == "cpu" and not drift):
        return None
    where = f"JAX on {inert_text(str(backend))} ({inert_text(str(figures.get('jax_device')), limit=40)})"
    if not drift:
        return where
    load = f" ({inert_text(str(drift['load']), limit=40)} load)" if drift.get("load") else ""
    return (f"{where}: fp32 passes ran at matmul precision 'highest'; at JAX's default precision{load} "
            f"{inert_text(str(drift['output']), limit=32)} drifts {_num(drift['vs_torch_fp32'])} from PyTorch fp32 "
            f"({_num(drift['vs_highest'])} from 'highest'; reported, not judged)")


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.2e}"


def parity_markdown(figures: dict[str, Any], escape: Any) -> list[str]:
    """A ``### Parity`` section; ``escape`` is the markdown reporter's cell escaping."""
    head = (f"`{escape(str(figures.get('torch_class', '-')), limit=80)}` / "
            f"`{escape(str(figures.get('flax_class', '-')), limit=80)}`, seed {figures.get('seed')}")
    out = ["### Parity", "", head, "", "| comparison | verdict | worst max rel | rule |", "|---|---|---:|---|"]
    for comp in figures.get("comparisons", []):
        worst = max((o["max_rel"] for o in comp["outputs"].values() if "max_rel" in o), default=0.0)
        verdict = ("passed" if comp["passed"] else "**failed**") if comp.get("judged", True) else "reported"
        out.append(f"| {escape(comp['name'], limit=40)} | {verdict} | {worst:.2e} "
                   f"| {escape(rule_text(comp.get('tolerance')), limit=120)} |")
    for comp in figures.get("comparisons", []):
        rows = output_rows(comp)
        if rows:
            out += ["", f"{escape(comp['name'], limit=40)}: Flax's error against the PyTorch fp32 reference, "
                        "PyTorch's own error in the same dtype, and their ratio", "",
                    "| output | Flax | PyTorch (own) | ratio | bound | verdict |", "|---|---:|---:|---:|---:|---|"]
            out += [f"| {escape(o, limit=80)} | {f} | {t} | {r} | {b} | {v} |" for o, f, t, r, b, v in rows]
    drift = drift_text(figures)
    if drift:
        out += ["", escape(drift, limit=400)]
    return [*out, ""]
