"""``python -m guard.worker``: one request on stdin, one answer on stdout (``guard.envs.protocol``).

Log lines of the libraries go to stderr; stdout carries only the answer.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from guard.parity.accelerator import wants_drift
from guard.envs.protocol import DRIFT_PASS, PROTOCOL, write_array

# target -> the module holding its library's code (load, parameters, forward, version)
SIDES = {"tunix": "guard.worker.tunix_side", "keras-hub": "guard.worker.keras_hub_side",
         "easydel": "guard.worker.easydel_side", "maxtext": "guard.worker.maxtext_side",
         "flax": "guard.worker.flax_side"}  # parity's transformers-4 Flax side: a request of its own (``answer``)
# what a library raises when it cannot load or run a checkpoint: reported, not a crash of the worker
LIBRARY_FAILURES = (ValueError, TypeError, KeyError, IndexError, AssertionError, RuntimeError, OSError,
                    NotImplementedError, AttributeError)


def answer(request: dict[str, Any]) -> dict[str, Any]:
    import jax

    side = importlib.import_module(SIDES[request["target"]])
    if hasattr(side, "answer"):  # a side with a request of its own rather than loads
        return side.answer(request)
    out_dir = Path(request["out_dir"])
    checkpoint, config = Path(request["checkpoint"]), request["config"]
    input_ids = request["inputs"]["input_ids"]
    loads = []
    for number, load in enumerate(request["loads"]):
        record: dict[str, Any] = {"label": load["label"], "options": load["options"], "error": None,
                                  "parameters": [], "outputs": {}}
        loads.append(record)
        try:
            handle = side.load(checkpoint, config, load["options"])
            for index, (name, array) in enumerate(sorted(side.parameters(handle).items())):
                record["parameters"].append({"name": name, **write_array(array, out_dir, f"l{number}p{index}")})
            for dtype in request["passes"]:
                # fp32 as PyTorch computes it: a TPU's default is one bf16 pass per product
                with jax.default_matmul_precision("highest" if dtype == "F32" else "default"):
                    logits = side.forward(handle, dtype, input_ids)
                record["outputs"][dtype] = {"logits": write_array(logits, out_dir, f"l{number}{dtype}")}
            if "F32" in request["passes"] and wants_drift(request.get("drift")):
                logits = _fp32_at_default_precision(side, handle, input_ids)
                record["outputs"][DRIFT_PASS] = {"logits": write_array(logits, out_dir, f"l{number}drift")}
        except LIBRARY_FAILURES as exc:
            record["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
    devices = jax.devices()
    backend = {"jax_backend": jax.default_backend(), "jax_device": devices[0].device_kind if devices else None}
    return {"protocol": PROTOCOL, "library": {"name": side.LIBRARY, "version": side.version()}, "backend": backend,
            "loads": loads}


def _fp32_at_default_precision(side: Any, handle: Any, input_ids: list[list[int]]) -> Any:
    """The fp32 pass again at JAX's default matmul precision (what users' own code runs): the drift figure.
    A side whose library sets its own precision (MaxText's ``matmul_precision`` flag) runs it its way."""
    import jax

    if hasattr(side, "forward_at_default_precision"):
        return side.forward_at_default_precision(handle, input_ids)
    with jax.default_matmul_precision("default"):
        return side.forward(handle, "F32", input_ids)


def main() -> int:
    request = json.loads(sys.stdin.read())
    if request.get("protocol") != PROTOCOL or request.get("target") not in SIDES:
        print(json.dumps({"protocol": PROTOCOL, "error": "unknown protocol or target"}))
        return 2
    reply = answer(request)
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
