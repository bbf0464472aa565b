"""torch <-> numpy without an fp32 bridge: bf16 and fp8 cross as integer bit views (ml_dtypes).

``t.numpy()`` refuses bf16 and fp8 (pytorch#90574) and ``torch.from_numpy`` refuses
ml_dtypes arrays, so both directions reinterpret the same bytes through an integer
dtype of the same width.  Nothing is converted, so nothing can round.

A conversion that casts nothing never needs a bf16 or fp8 *value*, only the bits and the
logical dtype's name (a safetensors code, a msgpack leaf's ``dtype.name``): ``storage_dtype``
holds those bits in numpy's own unsigned integers, and ``numpy_name`` names them, without
importing ml_dtypes (0.7.0's import is ~0.75 s, a third of a 1.5 GB conversion's time).
``numpy_dtype`` (ml_dtypes' float types) is for the code that computes with the values: casts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard import dtypes

if TYPE_CHECKING:
    import numpy as np
    import torch

# torch dtype name -> the integer dtype of the same width used as the bridge.
_BIT_BRIDGE = {
    "bfloat16": "int16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float8_e8m0fnu": "uint8",
}


# codes whose numpy dtype is ml_dtypes' -> numpy's unsigned integer of the same width
_STORED_AS = {
    "BF16": "uint16",
    "F8_E4M3": "uint8",
    "F8_E5M2": "uint8",
    "F8_E4M3FNUZ": "uint8",
    "F8_E5M2FNUZ": "uint8",
    "F8_E8M0": "uint8",
}


def numpy_name(code: str) -> str:
    """The ``dtype.name`` of a safetensors code's numpy dtype (``bfloat16`` for BF16), without ml_dtypes."""
    info = dtypes.DTYPES.get(code)
    if info is None or info.numpy is None or info.bits < 8:
        raise ValueError(f"dtype {code} cannot be converted")
    return info.numpy


def storage_dtype(code: str) -> np.dtype[Any]:
    """A numpy dtype that holds a code's stored bits: its own, or an unsigned integer of its width
    (bf16 and fp8), so that nothing imports ml_dtypes to move bytes it never computes with."""
    import numpy as np

    return np.dtype(_STORED_AS.get(code) or numpy_name(code))


def numpy_dtype(code: str) -> np.dtype[Any]:
    """The numpy dtype (ml_dtypes for bf16/fp8) of a safetensors code."""
    name = numpy_name(code)
    import ml_dtypes  # noqa: F401  (registers bfloat16 / float8_* with numpy)
    import numpy as np

    return np.dtype(getattr(ml_dtypes, name, None) or name)


def dtype_code(dtype: Any) -> str:
    """The safetensors code of a numpy or torch dtype (by name, never by class)."""
    name = str(dtype).removeprefix("torch.")
    code = dtypes.NUMPY_NAMES.get(name) or dtypes.TORCH_NAMES.get(name)
    if code is None:
        raise ValueError(f"dtype {name} has no safetensors code")
    return code


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy array with the same bits as ``t`` (shares memory when ``t`` is a CPU tensor)."""
    import torch

    name = str(t.dtype).removeprefix("torch.")
    bridge = _BIT_BRIDGE.get(name)
    t = t.detach().cpu()
    if bridge is None:
        return t.numpy()
    return t.view(getattr(torch, bridge)).numpy().view(numpy_dtype(dtype_code(name)))


def numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    """A torch tensor with the same bits as ``a`` (a C-contiguous copy, so it owns its memory)."""
    import numpy as np
    import torch

    code = dtype_code(a.dtype.name)
    a = np.array(a, copy=True, order="C")  # writable and contiguous: from_numpy needs both
    name = dtypes.DTYPES[code].torch
    bridge = _BIT_BRIDGE.get(name or "")
    if bridge is None:
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(np.dtype(bridge))).view(getattr(torch, name))  # type: ignore[arg-type]  # torch's view takes a torch dtype; getattr's result is one


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bytes of ``a`` as a flat uint8 array, for bit-exact comparisons (NaN payloads included)."""
    import numpy as np

    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
