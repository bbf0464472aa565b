"""Comparing two sets of model outputs, and the tolerances they are judged by.

numpy only: the arrays arrive as float32/float64 from either framework.
Sources for every bound are in docs/parity.md (reference §11-13); the low-precision verdict,
relative to PyTorch's own error, is ``guard.parity.relative``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from guard.records import Record


class Tolerance(Record):
    dtype: str  # F32: both sides computing in fp32 (for bf16/fp16 weights, upcast bit-exactly)
    max_rel: float  # max |a - b| / max |ref| over each output
    source: str


# fp32: transformers' check_pt_flax_outputs uses max abs <= 1e-5 (PR #15841), 5e-5 where deep
# models were flaky (PR #17780); here relative to the output's scale.  Low-precision passes are
# judged against PyTorch's own error instead: guard.parity.relative.
TOLERANCES: dict[str, Tolerance] = {
    "F32": Tolerance("F32", 1e-5, "transformers check_pt_flax_outputs 1e-5 (PR #15841)"),
    "F32-deep": Tolerance("F32", 5e-5, "transformers PR #17780: 5e-5 for deep models"),
}
DEEP_LAYERS = 8  # more layers than this: the "deep" fp32 bound


def tolerance_for(*, layers: int) -> Tolerance:
    return TOLERANCES["F32-deep" if layers > DEEP_LAYERS else "F32"]


def compare_output(name: str, ref: Any, other: Any, *, tie: float) -> dict[str, Any]:
    """Every figure for one output; ``ref`` is the side the scale is taken from.  Top-1 picks whose
    reference logits lie within ``tie x max|ref|`` of each other count as agreeing (near-ties)."""
    a = np.asarray(ref, dtype=np.float64)
    b = np.asarray(other, dtype=np.float64)
    if a.shape != b.shape and a.ndim == 4 and b.shape == a.transpose(0, 2, 3, 1).shape:
        b = b.transpose(0, 3, 1, 2)  # a Flax conv output in NHWC
    if a.shape != b.shape:
        return {"shape": list(a.shape), "other_shape": list(b.shape), "shape_mismatch": True}
    bad_a, bad_b = ~np.isfinite(a), ~np.isfinite(b)
    # NaN-masked as transformers' check_pt_flax_outputs does; a different non-finite pattern fails.
    same_class = (np.isnan(a) & np.isnan(b)) | (a == b)
    nonfinite_mismatch = int(np.count_nonzero((bad_a | bad_b) & ~same_class))
    mask = ~(bad_a | bad_b)
    a_m, b_m = np.where(mask, a, 0.0), np.where(mask, b, 0.0)
    diff = np.abs(a_m - b_m)
    max_ref = float(np.abs(a_m).max(initial=0.0))
    max_abs = float(diff.max(initial=0.0))
    figures: dict[str, Any] = {
        "shape": list(a.shape),
        "max_abs": max_abs,
        "mean_abs": float(diff.sum() / max(int(mask.sum()), 1)),
        "max_ref": max_ref,
        "max_rel": max_abs / max_ref if max_ref > 0 else (0.0 if max_abs == 0 else float("inf")),
        "cosine": _cosine(a_m.ravel(), b_m.ravel()),
        "nonfinite_ref": int(bad_a.sum()),
        "nonfinite_other": int(bad_b.sum()),
        "nonfinite_mismatch": nonfinite_mismatch,
    }
    if is_logits(name) and a.ndim >= 2 and a.shape[-1] > 1:
        figures.update(_top1(a_m, b_m, tie * max_ref))
    return figures


def is_logits(name: str) -> bool:
    return name.split(".")[0].endswith("logits")


def _cosine(a: Any, b: Any) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def _top1(a: Any, b: Any, slack: float) -> dict[str, float]:
    """Raw top-1 agreement, and agreement counting near-ties (within the tolerance) as agreeing:
    a tiny random model has near-tied logits that flip on any rounding."""
    rows_a, rows_b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    pick_a, pick_b = rows_a.argmax(-1), rows_b.argmax(-1)
    agree = pick_a == pick_b
    idx = np.arange(rows_a.shape[0])
    tied = rows_a[idx, pick_a] - rows_a[idx, pick_b] <= slack
    return {"top1": float(agree.mean()), "top1_tie_aware": float((agree | tied).mean())}


def judge(outputs: dict[str, dict[str, Any]], tol: Tolerance) -> list[tuple[str, str, float, float]]:
    """Failures as (output, metric, value, threshold), worst first."""
    failures = []
    for name, fig in outputs.items():
        if fig.get("shape_mismatch"):
            failures.append((name, "shape", float("inf"), 0.0))
            continue
        if fig["nonfinite_mismatch"]:
            failures.append((name, "nonfinite_mismatch", float(fig["nonfinite_mismatch"]), 0.0))
        if not fig["max_rel"] <= tol.max_rel:
            failures.append((name, "max_rel", fig["max_rel"], tol.max_rel))
    return sorted(failures, key=lambda f: f[2] / f[3] if f[3] else float("inf"), reverse=True)
