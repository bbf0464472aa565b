"""The worker's request and answer, as JSON (stdin -> stdout).

Request::

    {"protocol": 1, "target": "tunix", "checkpoint": DIR, "config": {config.json},
     "loads": [{"label": "defaults", "options": {...}}, ...],
     "inputs": {"input_ids": [[...]]}, "passes": ["F32", "BF16"], "drift": bool | null, "out_dir": TMP}

Answer::

    {"protocol": 1, "library": {"name": ..., "version": ...}, "backend": {...},
     "loads": [{"label", "options", "error": str | null,
                "parameters": [{"name", "dtype", "shape", "npy", "sha256"}],
                "outputs": {"F32": {"logits": {"dtype", "shape", "npy", "sha256"}}, ...}}]}

``"drift"``: as ``parity --drift`` (null: on an accelerator only); when on, each load's outputs also hold
``"F32:default"``, the fp32 pass at JAX's default matmul precision.

parity's Flax side (target ``flax``, ``guard.worker.flax_side``) has a request of its own; its answer
is the same envelope with ``"loads": []`` and a ``"parity"`` object.

An array travels as a ``.npy`` the worker wrote under ``out_dir`` (given by the parent, removed by
it) and the SHA-256 of its bytes.  A dtype numpy cannot name in a ``.npy`` (bfloat16, the float8s)
is written as the unsigned integer of its width and named in ``dtype``: the bits, not a copy.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

PROTOCOL = 1
PASSES = ("F32", "BF16", "F16")
DRIFT_PASS = "F32:default"  # the fp32 pass again at JAX's default matmul precision (``"drift"`` in the request)
_UINT_OF_WIDTH = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


class ProtocolError(ValueError):
    """An answer that does not follow the protocol (a worker from another version, a truncated reply)."""


def write_array(array: Any, out_dir: Path, stem: str) -> dict[str, Any]:
    """Saves ``array`` bit for bit; returns its record."""
    import numpy as np

    array = np.ascontiguousarray(array)
    dtype = array.dtype.name
    native = array.dtype.kind in "biuf" and dtype in {"bool", "float16", "float32", "float64"} | {
        f"{k}{w}" for k in ("int", "uint") for w in (8, 16, 32, 64)}
    stored = array if native else array.view(_UINT_OF_WIDTH[array.dtype.itemsize])
    path = Path(out_dir) / f"{stem}.npy"
    np.save(path, stored, allow_pickle=False)
    return {"dtype": dtype, "shape": list(array.shape), "npy": str(path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def read_array(record: dict[str, Any], out_dir: Path) -> Any:
    """The array a record names, checked: inside ``out_dir``, digest, shape, in its own dtype."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 and the float8s with numpy)
    import numpy as np

    path = Path(record["npy"]).resolve()
    if Path(out_dir).resolve() not in path.parents:
        raise ProtocolError(f"worker named a file outside its folder: {record['npy']!r}")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise ProtocolError(f"{path.name}: digest differs from the worker's answer")
    stored = np.load(path, allow_pickle=False)
    dtype = np.dtype(getattr(ml_dtypes, record["dtype"], None) or record["dtype"])
    array = stored if stored.dtype == dtype else stored.view(dtype)
    if list(array.shape) != list(record["shape"]):
        raise ProtocolError(f"{path.name}: shape {list(array.shape)} differs from {record['shape']}")
    return array


def check_answer(answer: Any) -> dict[str, Any]:
    if not isinstance(answer, dict) or answer.get("protocol") != PROTOCOL or not isinstance(answer.get("loads"), list) \
            or not isinstance(answer.get("parity", {}), dict):
        raise ProtocolError("worker's answer is not protocol 1")
    return answer
