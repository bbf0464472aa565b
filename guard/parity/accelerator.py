"""Where the JAX side ran, and what JAX's default matmul precision would have cost there.

The JAX side of parity runs on whatever JAX picks: a TPU or GPU when it sees one, else the CPU.
Its fp32 passes run under ``jax_default_matmul_precision="highest"`` (``guard.parity.run``): a
TPU's default is one bf16 pass per fp32 product (2.6e-3 relative error on a plain matmul, 1.5e-2
after eight RMSNorm + MLP layers on a v5e), a GPU's is TF32, and neither is what PyTorch on a CPU
computes.  Users' own code mostly runs at the default, so on an accelerator the fp32 pass runs
once more at the default precision and the drift is reported as a figure beside the verdict,
never as a failure.  On the CPU the two precisions compute the same thing, so nothing is rerun
unless asked (``drift=True``; the tests use it to check the figure itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DRIFT_OUTPUT = "logits"  # the figure is taken on the model's final output where it has one


def backend_figures() -> dict[str, Any]:
    """``jax_backend`` (cpu, tpu, gpu) and the first device's kind (``TPU v5 lite``)."""
    import jax

    devices = jax.devices()
    return {"jax_backend": jax.default_backend(), "jax_device": devices[0].device_kind if devices else None}


def wants_drift(drift: bool | None) -> bool:
    """None: on an accelerator only.  True/False: as asked."""
    if drift is not None:
        return drift
    import jax

    return jax.default_backend() != "cpu"


def default_precision_drift(run_fp32: Callable[[], dict[str, Any]], highest: dict[str, Any],
                            reference: dict[str, Any]) -> dict[str, Any]:
    """Runs the JAX fp32 pass again at JAX's default matmul precision.

    ``highest``: the same pass's outputs at full precision; ``reference``: PyTorch's fp32 outputs.
    Returns the max |difference| over each output's max |value| for the default-precision run
    against both, on ``logits`` where the model has it, else on its last output."""
    import jax

    with jax.default_matmul_precision("default"):
        default = run_fp32()
    return drift_figures(default, highest, reference)


def drift_figures(default: dict[str, Any], highest: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """The figures of a default-precision fp32 run already made (here, or by the worker elsewhere)."""
    name = DRIFT_OUTPUT if DRIFT_OUTPUT in default else sorted(default)[-1]
    return {
        "precision": "default",
        "output": name,
        "vs_highest": _relative(highest.get(name), default[name]),
        "vs_torch_fp32": _relative(reference.get(name), default[name]),
        "highest_vs_torch_fp32": _relative(reference.get(name), highest.get(name)),
    }


def _relative(ref: Any, other: Any) -> float | None:
    import numpy as np

    if ref is None or other is None:
        return None
    a, b = np.asarray(ref, dtype=np.float64), np.asarray(other, dtype=np.float64)
    if a.shape != b.shape:
        return None
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.any():
        return None
    scale = float(np.max(np.abs(a[finite]))) or 1.0
    return float(np.max(np.abs(a[finite] - b[finite]))) / scale
