"""Which block disagrees first: the streamed runs' per-module outputs, judged like the model's outputs.

Both sides run their whole forward pass, block after block, so a block's output carries what
came before it.  A correct conversion keeps every block within the comparison's bound (the fp32
bound, or for bf16/fp16 Flax within ``factor x`` PyTorch's own error + floor), so the first
block out of bound, in the order PyTorch ran them, is where the stored weights differ: the
blocks before it agree.  Within that block, its first direct child out of bound is named
(``model.layers.23.self_attn``), else the block itself.  With no block out of bound (a wrong
embedding, final norm or head), the first module out of bound is named.

A block out of bound fails its comparison even where the model's outputs pass: every layer is
judged, not only what reaches the logits.  Children only name, they never fail a comparison:
an intermediate output (an attention sum) has no bound of its own in the sources.  numpy only.
"""

from __future__ import annotations

from typing import Any

from guard.parity.metrics import Tolerance, compare_output
from guard.parity.relative import RelativeRule, low_precision_outputs


def module_figures(ref: dict[str, Any], other: dict[str, Any], *, tol: Tolerance | None = None,
                   own: dict[str, Any] | None = None, rule: RelativeRule | None = None) -> dict[str, dict[str, Any]]:
    """Per module present on both sides with one shape (PyTorch's order): max_rel, bound, failed."""
    figures = {}
    for name in ref:
        if name not in other or (own is not None and name not in own):
            continue
        if own is not None and rule is not None:
            fig = low_precision_outputs({name: ref[name]}, {name: other[name]}, {name: own[name]}, rule).get(name)
            if fig is None or fig.get("shape_mismatch"):
                continue
            failed = not fig["max_rel"] <= fig["bound"] or fig["nonfinite_mismatch"] > fig["own_nonfinite_mismatch"]
        else:
            assert tol is not None
            fig = compare_output(name, ref[name], other[name], tie=0.0)
            if fig.get("shape_mismatch"):
                continue  # a layout the two frameworks name alike but shape apart: not comparable here
            fig["bound"] = tol.max_rel
            failed = not fig["max_rel"] <= fig["bound"] or fig["nonfinite_mismatch"] > 0
        figures[name] = {"max_rel": fig["max_rel"], "bound": fig["bound"], "failed": failed}
    return figures


def locate(figures: dict[str, dict[str, Any]], blocks: list[str]) -> dict[str, Any]:
    """The first block out of bound and the module named for it; every block's figure."""
    judged = [b for b in figures if b in set(blocks)]
    failing = [b for b in judged if figures[b]["failed"]]
    named = None
    if failing:
        first = failing[0]
        children = [n for n in figures if n.startswith(first + ".") and figures[n]["failed"]]
        named = children[0] if children else first
    else:
        named = next((n for n, fig in figures.items() if fig["failed"]), None)
    return {
        "blocks": len(blocks),
        "blocks_compared": len(judged),
        "modules_compared": len(figures),
        "failing_blocks": len(failing),
        "first": None if named is None else {"module": named, "max_rel": figures[named]["max_rel"],
                                             "bound": figures[named]["bound"]},
        "per_block": [{"block": b, "max_rel": figures[b]["max_rel"], "bound": figures[b]["bound"]} for b in judged],
    }


def clause(located: dict[str, Any] | None) -> str:
    """The finding's words for it: the module and its error against its bound."""
    if not located or not located.get("first"):
        return ""
    first = located["first"]
    return (f"; first block that disagrees: {first['module']!r} (max_rel {first['max_rel']:.3g} against "
            f"{first['bound']:.3g})")
