"""The low-precision verdict: Flax's error against the fp32 reference, judged by PyTorch's own.

A bf16/fp16 model has no single right answer in its stored dtype: each framework rounds in its
own order (Flax's ``avg_pool`` sums in bf16, PyTorch keeps a sinusoidal table as stored).  So
three passes on the same seeded inputs decide it: PyTorch in fp32 (the reference), PyTorch in
the stored dtype and Flax in the stored dtype.  Per output:

- continuous: Flax's ``max_rel`` against the reference must stay within
  ``factor x`` PyTorch's own ``max_rel`` against it ``+ floor`` (the floor, in units of the
  output's scale, covers outputs PyTorch reproduces exactly, such as an embedding lookup);
- discrete (top-1 labels of logits, quantizer code choices): the share of rows where Flax
  disagrees with the reference must stay within ``factor x`` PyTorch's own share ``+ floor``;
- non-finite: Flax may not turn more positions NaN/Inf than PyTorch does in the same dtype.

The factor and floors come from ``bench/parity.py`` over the whole architecture sweep;
docs/parity.md shows the distribution they were read from.  numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from guard import DOCS_URL
from guard.parity.metrics import compare_output, is_logits
from guard.records import Record


class RelativeRule(Record):
    dtype: str  # BF16 | F16: the compute dtype of both low-precision passes
    factor: float  # Flax's error may be this many times PyTorch's own
    floor: float  # plus this, in units of the output's scale (max |reference|)
    agreement_floor: float  # plus this share of rows, for discrete outputs
    source: str


SOURCE = f"{DOCS_URL}parity.md (the architecture sweep)"
# factor: the next power of two above the largest ratio a correct conversion showed in the sweep
# (5.2, RegNet's bf16 avg_pool); floor: one unit roundoff of the dtype (bf16 2^-8, fp16 2^-11) at the
# output's scale, for outputs PyTorch reproduces exactly and Flax rounds once more
RULES: dict[str, RelativeRule] = {
    "BF16": RelativeRule("BF16", 8.0, 2.0 ** -8, 0.05, SOURCE),
    "F16": RelativeRule("F16", 8.0, 2.0 ** -11, 0.05, SOURCE),
}
# outputs that are discrete choices in continuous clothing: a row either picked the same codes or not
DISCRETE = {"projected_quantized_states": "quantizer code choices (an argmax over codevectors per frame)"}
ROW_AGREES = 0.1  # a row agrees when its max |diff| is within this share of the output's scale:
# bf16 rounding moves a row by ~1e-2 of the scale, a flipped code choice by the order of the scale


def rule_for(codes: tuple[str, ...]) -> RelativeRule:
    return RULES["BF16" if "BF16" in codes else "F16"]


def low_precision_outputs(ref: dict[str, Any], flax: dict[str, Any], torch: dict[str, Any],
                          rule: RelativeRule) -> dict[str, dict[str, Any]]:
    """Every figure of Flax against the reference, with PyTorch's own beside it (``own_*``)."""
    outputs = {}
    for name in ref:
        if name not in flax or name not in torch:
            continue
        own = compare_output(name, ref[name], torch[name], tie=0.0)
        if own.get("shape_mismatch"):
            continue  # PyTorch against itself: cannot happen, and says nothing about Flax
        fig = compare_output(name, ref[name], flax[name], tie=0.0)
        if fig.get("shape_mismatch"):
            outputs[name] = fig
            continue
        bound = rule.factor * own["max_rel"] + rule.floor
        fig.update(own_max_rel=own["max_rel"], ratio=_ratio(fig["max_rel"], own["max_rel"]), bound=bound,
                   own_nonfinite_mismatch=own["nonfinite_mismatch"])
        if name in DISCRETE:
            fig.update(discrete=DISCRETE[name], **_agreement(ref[name], flax[name], torch[name]))
        elif is_logits(name) and fig.get("top1") is not None:
            # near-ties within the output's bound are not disagreements, for either side
            fig["top1_tie_aware"] = compare_output(name, ref[name], flax[name], tie=bound)["top1_tie_aware"]
            fig["own_top1_tie_aware"] = compare_output(name, ref[name], torch[name], tie=bound)["top1_tie_aware"]
        outputs[name] = fig
    return outputs


def judge_low_precision(outputs: dict[str, dict[str, Any]],
                        rule: RelativeRule) -> list[tuple[str, str, float, float]]:
    """Failures as (output, metric, value, threshold), worst first (by how far over)."""
    failures = []
    for name, fig in outputs.items():
        if fig.get("shape_mismatch"):
            failures.append((name, "shape", float("inf"), 0.0))
            continue
        if fig["nonfinite_mismatch"] > fig["own_nonfinite_mismatch"]:
            failures.append((name, "nonfinite_mismatch", float(fig["nonfinite_mismatch"]),
                             float(fig["own_nonfinite_mismatch"])))
        if "agreement" in fig:
            allowed = rule.factor * (1.0 - fig["own_agreement"]) + rule.agreement_floor
            if 1.0 - fig["agreement"] > allowed:
                failures.append((name, "disagreement", 1.0 - fig["agreement"], allowed))
            continue  # discrete: judged by agreement, not max_rel
        if not fig["max_rel"] <= fig["bound"]:
            failures.append((name, "max_rel", fig["max_rel"], fig["bound"]))
        if "own_top1_tie_aware" in fig:
            allowed = rule.factor * (1.0 - fig["own_top1_tie_aware"]) + rule.agreement_floor
            if 1.0 - fig["top1_tie_aware"] > allowed:
                failures.append((name, "top1_disagreement", 1.0 - fig["top1_tie_aware"], allowed))
    return sorted(failures, key=lambda f: f[2] / f[3] if f[3] else float("inf"), reverse=True)


def _ratio(flax: float, own: float) -> float | None:
    """Flax's error over PyTorch's own; None where PyTorch's is exactly zero (the floor decides)."""
    if own > 0:
        return flax / own
    return 0.0 if flax == 0 else None


def _agreement(ref: Any, flax: Any, torch: Any) -> dict[str, float]:
    a = np.asarray(ref, dtype=np.float64)
    scale = float(np.abs(np.where(np.isfinite(a), a, 0.0)).max(initial=0.0)) or 1.0

    def share(other: Any) -> float:
        b = np.asarray(other, dtype=np.float64)
        rows = np.abs(a - b).reshape(-1, a.shape[-1]) if a.ndim else np.abs(a - b).reshape(1, 1)
        agree = np.nan_to_num(rows, nan=np.inf).max(axis=-1) <= ROW_AGREES * scale
        return float(agree.mean()) if agree.size else 1.0

    return {"agreement": share(flax), "own_agreement": share(torch)}
