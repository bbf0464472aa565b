"""A target's loads, run by a side's ``load``, ``parameters`` and ``forward`` (``Side.answer``'s body).

Each load is one call of the library's loader with the row's options; every parameter it holds is
written as an array record, then its logits for each pass: fp32 under matmul precision "highest"
(as PyTorch computes it; a TPU's default is one bf16 pass per product), the file's dtype at the default,
and, where the request asks for it, the fp32 pass again at JAX's default precision (the drift figure).
What the library raises when it cannot load or run the checkpoint is the load's error, not a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from guard.envs.protocol import DRIFT_PASS, write_array
from guard.parity.accelerator import wants_drift

LIBRARY_FAILURES = (ValueError, TypeError, KeyError, IndexError, AssertionError, RuntimeError, OSError,
                    NotImplementedError, AttributeError)


def run_loads(request: dict[str, Any], out_dir: Path, *, load: Callable[[Path, dict[str, Any], dict[str, Any]], Any],
              parameters: Callable[[Any], dict[str, Any]], forward: Callable[[Any, str, list[list[int]]], Any],
              forward_at_default_precision: Callable[[Any, list[list[int]]], Any] | None = None,
              ) -> list[dict[str, Any]]:
    """One record per load.  ``forward_at_default_precision``: for a library that sets its matmuls' precision
    from its own flag (MaxText), the drift pass its own way; else ``forward`` at JAX's default."""
    import jax

    checkpoint, config = Path(request["checkpoint"]), request["config"]
    input_ids = request["inputs"]["input_ids"]
    loads = []
    for number, options in enumerate(request["loads"]):
        record: dict[str, Any] = {"label": options["label"], "options": options["options"], "error": None,
                                  "parameters": [], "outputs": {}}
        loads.append(record)
        try:
            handle = load(checkpoint, config, options["options"])
            for index, (name, array) in enumerate(sorted(parameters(handle).items())):
                record["parameters"].append({"name": name, **write_array(array, out_dir, f"l{number}p{index}")})
            for dtype in request["passes"]:
                with jax.default_matmul_precision("highest" if dtype == "F32" else "default"):
                    logits = forward(handle, dtype, input_ids)
                record["outputs"][dtype] = {"logits": write_array(logits, out_dir, f"l{number}{dtype}")}
            if "F32" in request["passes"] and wants_drift(request.get("drift")):
                if forward_at_default_precision is not None:
                    logits = forward_at_default_precision(handle, input_ids)
                else:
                    with jax.default_matmul_precision("default"):
                        logits = forward(handle, "F32", input_ids)
                record["outputs"][DRIFT_PASS] = {"logits": write_array(logits, out_dir, f"l{number}drift")}
        except LIBRARY_FAILURES as exc:
            record["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
    return loads
