"""The one step vocabulary of the targets' mappings (``guard.targets``), and its one interpreter.

A target's mapping names, for each Hugging Face tensor, the steps that turn it into the array the
target holds: ``transpose`` (a matrix's ``W.T``), ``heads_in`` (q/k/v: ``W.T`` reshaped
[hidden, heads, head_dim]), ``heads_out`` (o_proj: ``W.T`` reshaped [heads, head_dim, hidden]),
``bias_heads``, ``interleave`` (RoPE halves -> pairs) and MaxText's scalings below.  Each step has
its inverse, so one mapping serves the way there and the way back.

Every step but the ``ROUNDING`` ones moves elements (a transpose, a reshape, the RoPE
interleave): exact both ways.  ``scale_query`` is MaxText's ``scale_query_layer``: the
query kernel multiplied by 1/sqrt(head_dim) in float32 and cast back to its dtype; the
way back multiplies by sqrt(head_dim).  Unless head_dim is a power of 4 that rounds, in
fp32 too, so the elements it changes are counted and declared (CG301), never silent.
Gemma's layout adds two more (``embed_scale``: the embedding times sqrt(hidden_size);
``norm_plus_one``: every RMSNorm weight stored as 1 + w), declared the same way; Gemma 3's
hook scales by sqrt(hidden_size) rounded to bfloat16 first (``embed_scale_bf16``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

Step = Callable[["np.ndarray", int], "np.ndarray"]
# the way back may not restore every bit of these
ROUNDING = frozenset({"scale_query", "embed_scale", "embed_scale_bf16", "norm_plus_one"})


def transposed(a: np.ndarray) -> np.ndarray:
    """``a.T`` of a matrix, C-contiguous, through the writer's tiled transposition (guard.write.transpose:
    ``np.ascontiguousarray(a.T)`` of bf16 took 3.9 of a 1.48 GB Llama's 8 s here, bench/maxtext.py)."""
    import numpy as np

    from guard.write.transpose import bit_view, permuted_bands

    out = np.empty(a.shape[::-1], a.dtype)
    flat, filled = bit_view(out).reshape(-1), 0

    def band(count: int) -> np.ndarray:
        nonlocal filled
        filled += count
        return flat[filled - count:filled]

    for _ in permuted_bands(a, (1, 0), band):
        pass
    return out


def _transpose(a: np.ndarray, head_dim: int) -> np.ndarray:
    return transposed(a)


def _heads_in(a: np.ndarray, head_dim: int) -> np.ndarray:
    """q/k/v: W [heads*head_dim, D] -> W.T reshaped [D, heads, head_dim] (MaxText's reshape_kernel)."""
    return transposed(a).reshape(a.shape[1], -1, head_dim)


def _heads_in_back(a: np.ndarray, head_dim: int) -> np.ndarray:
    return transposed(a.reshape(a.shape[0], -1))


def _heads_out(a: np.ndarray, head_dim: int) -> np.ndarray:
    """o_proj: W [D, heads*head_dim] -> W.T reshaped [heads, head_dim, D]."""
    return transposed(a).reshape(-1, head_dim, a.shape[0])


def _heads_out_back(a: np.ndarray, head_dim: int) -> np.ndarray:
    return transposed(a.reshape(-1, a.shape[-1]))


def _bias_heads(a: np.ndarray, head_dim: int) -> np.ndarray:
    return a.reshape(-1, head_dim)


def _flatten(a: np.ndarray, head_dim: int) -> np.ndarray:
    return a.reshape(-1)


def _interleave(a: np.ndarray, head_dim: int) -> np.ndarray:
    """HF's RoPE halves [x0..x(h/2-1), y0..] -> MaxText's pairs [x0, y0, x1, y1, ...] (adjust_rope)."""
    import numpy as np

    half = a.shape[-1] // 2
    return np.stack([a[..., :half], a[..., half:]], axis=-1).reshape(a.shape)


def _deinterleave(a: np.ndarray, head_dim: int) -> np.ndarray:
    import numpy as np

    return np.concatenate([a[..., ::2], a[..., 1::2]], axis=-1)


def _scaled(a: np.ndarray, factor: float) -> np.ndarray:
    import numpy as np

    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return (a.astype(np.float32) * np.float32(factor)).astype(a.dtype)


def _scale_query(a: np.ndarray, head_dim: int) -> np.ndarray:
    import numpy as np

    return _scaled(a, 1 / np.sqrt(head_dim))  # float64 quotient, then float32: as MaxText computes it


def _unscale_query(a: np.ndarray, head_dim: int) -> np.ndarray:
    import numpy as np

    return _scaled(a, np.sqrt(head_dim))


def _embed_scale(a: np.ndarray, head_dim: int) -> np.ndarray:
    """Gemma's embedding [V, D] times float32(sqrt(D)), cast back (pad_hf_embedding_layer; D is the array's own
    last axis, hidden_size): MaxText's Gemma decoder looks up the scaled rows and divides the tied logits by it."""
    import numpy as np

    return _scaled(a, np.float32(a.shape[-1] ** 0.5))


def _embed_unscale(a: np.ndarray, head_dim: int) -> np.ndarray:
    import numpy as np

    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # a division, as MaxText's way back
        return (a.astype(np.float32) / np.float32(a.shape[-1] ** 0.5)).astype(a.dtype)


def bfloat16_sqrt(n: int) -> float:
    """sqrt(n) rounded to nearest-even bfloat16 (8 significant bits), from float64 as numpy's
    ``np.dtype("bfloat16").type(n ** 0.5)`` does; computed here so that convert needs no ml_dtypes."""
    import math

    mantissa, exponent = math.frexp(n ** 0.5)  # mantissa in [0.5, 1): 8 bits are 2**8 * mantissa, rounded
    return math.ldexp(round(math.ldexp(mantissa, 8)), exponent - 8)


def _embed_scale_bf16(a: np.ndarray, head_dim: int) -> np.ndarray:
    """Gemma 3's embedding [V, D] times bfloat16(sqrt(D)), in float32, cast back (pad_and_scale_embedding: its
    normalizer is a bfloat16 scalar in every dtype; transformers' bf16 forward scales by the same value)."""
    return _scaled(a, bfloat16_sqrt(a.shape[-1]))


def _embed_unscale_bf16(a: np.ndarray, head_dim: int) -> np.ndarray:
    import numpy as np

    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # a division, as MaxText's way back
        return (a.astype(np.float32) / np.float32(bfloat16_sqrt(a.shape[-1]))).astype(a.dtype)


def _norm_plus_one(a: np.ndarray, head_dim: int) -> np.ndarray:
    """Gemma's RMSNorm weight w -> 1 + w (scale_rmsnorm_layer): HF's Gemma norm multiplies by 1 + w, MaxText's by
    its scale; in float32, cast back (what numpy's ``a + 1.0`` does for bf16 and fp16)."""
    import numpy as np

    return (a.astype(np.float32) + np.float32(1)).astype(a.dtype)


def _norm_minus_one(a: np.ndarray, head_dim: int) -> np.ndarray:
    import numpy as np

    return (a.astype(np.float32) - np.float32(1)).astype(a.dtype)


STEPS: dict[str, tuple[Step, Step]] = {  # name -> (to the target, back to HF)
    "transpose": (_transpose, _transpose),
    "heads_in": (_heads_in, _heads_in_back),
    "heads_out": (_heads_out, _heads_out_back),
    "bias_heads": (_bias_heads, _flatten),
    "interleave": (_interleave, _deinterleave),
    "scale_query": (_scale_query, _unscale_query),
    "embed_scale": (_embed_scale, _embed_unscale),
    "embed_scale_bf16": (_embed_scale_bf16, _embed_unscale_bf16),
    "norm_plus_one": (_norm_plus_one, _norm_minus_one),
}
# what each rounding step does, as a CG301 finding says it (MaxText's hook named)
ROUNDING_SAYS = {
    "scale_query": "multiplies it by 1/sqrt(head_dim) in float32 and casts it back (scale_query_layer)",
    "embed_scale": "multiplies it by sqrt(hidden_size) in float32 and casts it back (pad_hf_embedding_layer; "
                   "MaxText's decoder divides the tied logits by the same factor)",
    "embed_scale_bf16": "multiplies it by sqrt(hidden_size) rounded to bfloat16, in float32, and casts it back "
                        "(pad_and_scale_embedding; MaxText's decoder divides the tied logits by the exact sqrt)",
    "norm_plus_one": "stores 1 + weight in its dtype (scale_rmsnorm_layer: HF's Gemma RMSNorm multiplies by "
                     "1 + weight, MaxText's by its scale)",
}


def to_target(a: np.ndarray, steps: tuple[str, ...], head_dim: int) -> np.ndarray:
    for name in steps:
        a = STEPS[name][0](a, head_dim)
    return a


def to_hf(a: np.ndarray, steps: tuple[str, ...], head_dim: int) -> np.ndarray:
    for name in reversed(steps):
        a = STEPS[name][1](a, head_dim)
    return a


def rounded_elements(original: np.ndarray, converted: np.ndarray, steps: tuple[str, ...], head_dim: int) -> int:
    """How many elements the way back cannot restore bit for bit (0 without a rounding step)."""
    import numpy as np

    if not ROUNDING.intersection(steps):
        return 0
    back = to_hf(converted, steps, head_dim)
    bits = np.dtype(f"u{original.dtype.itemsize}")
    return int(np.count_nonzero(np.ascontiguousarray(back).view(bits) != np.ascontiguousarray(original).view(bits)))
