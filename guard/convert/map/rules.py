"""The generic PT <-> Flax renaming of one parameter, as transformers' ``rename_key_and_reshape_tensor`` does it.

transformers decides between ``scale``, ``embedding`` and ``kernel`` by looking the name up in
the Flax model's randomly initialised tree.  Here the same decision comes from the name and
rank alone, plus the family's ``norm_weight`` flag: a 1-D ``weight`` is a norm's ``scale``
(or stays ``weight`` where the Flax norm is an RMSNorm or T5's LayerNorm), a 2-D ``weight`` of
an embedding module is an ``embedding``, any other ``weight`` is a ``kernel`` with its axes
permuted.  ``tests/test_convert_families.py`` proves the result equal to transformers' trees.
"""

from __future__ import annotations

import re

from guard.write.plan import Key, Perm

# Linear [out, in] -> [in, out]; Conv1d [O, I, k] -> [k, I, O]; Conv2d [O, I, kH, kW] -> [kH, kW, I, O]
KERNEL_PERMS: dict[int, Perm] = {2: (1, 0), 3: (2, 1, 0), 4: (2, 3, 1, 0), 5: (2, 3, 4, 1, 0)}
EMBEDDING_MODULE = re.compile(r"(^|_)(embeddings?|embed_tokens|embed_positions)$|^(wte|wpe|shared|"
                              r"relative_attention_bias)$")
COLLECTIONS = ("params", "batch_stats")


def inverse(perm: Perm) -> Perm:
    return tuple(sorted(range(len(perm)), key=perm.__getitem__))


def torch_to_flax(key: Key, ndim: int, *, norm_weight: bool) -> tuple[Key, Perm | None]:
    """The Flax key (without the ``params`` collection) and axis permutation of a PyTorch tensor."""
    base, last = key[:-1], key[-1]
    if last == "running_mean":
        return ("batch_stats", *base, "mean"), None
    if last == "running_var":
        return ("batch_stats", *base, "var"), None
    if len(key) >= 3 and key[-3] == "parametrizations" and last in ("original0", "original1"):
        return (*key[:-3], key[-2] + ("_g" if last == "original0" else "_v")), None
    if last == "beta":  # LayerNorm names of checkpoints ported from TensorFlow
        return (*base, "bias"), None
    if last == "gamma" or (last == "weight" and ndim == 1):
        return (*base, "weight" if norm_weight else "scale"), None
    if last == "weight" and ndim == 2 and base and EMBEDDING_MODULE.search(base[-1]):
        return (*base, "embedding"), None
    if last == "weight" and ndim in KERNEL_PERMS:
        return (*base, "kernel"), KERNEL_PERMS[ndim]
    return key, None


def flax_to_torch(key: Key, ndim: int) -> tuple[Key, Perm | None]:
    """The PyTorch name and axis permutation of a Flax leaf (``params`` / ``batch_stats`` stripped)."""
    collection = "params"
    if key and key[0] in COLLECTIONS:
        collection, key = key[0], key[1:]
    base, last = key[:-1], key[-1]
    if collection == "batch_stats" and last in ("mean", "var"):
        return (*base, "running_" + last), None
    if last == "kernel" and ndim in KERNEL_PERMS:
        return (*base, "weight"), inverse(KERNEL_PERMS[ndim])
    if last in ("scale", "embedding"):
        return (*base, "weight"), None
    if last in ("weight_g", "weight_v"):
        return (*base, "parametrizations", "weight", "original" + ("0" if last == "weight_g" else "1")), None
    return key, None
