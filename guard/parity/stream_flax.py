"""The Flax side, streamed: transformers' own Flax ``__call__``, one block's parameters at a time.

The model is built with ``_do_init=False`` (its parameter tree exists only as shapes).  What is
not in a block is loaded once and passed as ``params``; the blocks are the PyTorch side's
(``model.layers.3`` is ``model/layers/3``).  A Flax method interceptor catches each block's
``__call__`` and applies an unbound clone of that module to its own parameters, read from the
checkpoint right then and dropped when it returns; every module's output is kept under the
PyTorch name, for ``guard.parity.located``.  Anything not placed exactly is ``NotStreamable``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard.parity.runs import flax_dtype_of, flax_kwargs, flax_outputs
from guard.parity.stream_torch import first_array
from guard.parity.weights import CheckpointWeights, NotStreamable, stored_naming

Key = tuple[str, ...]


def stream_flax(cls: Any, config: Any, directory: Path, dtype: str, inputs: dict[str, Any],
                blocks: list[str], leaves: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(outputs, module outputs by PyTorch name).  ``dtype`` F32 upcasts every floating parameter.
    ``leaves``: the PyTorch side's leaf units (embeddings, head), streamed like the blocks."""
    import flax.linen as nn
    import jax
    from flax.traverse_util import flatten_dict

    compute = flax_dtype_of(dtype)
    weights = CheckpointWeights(directory, "flax", separator="/")
    try:  # the Flax side's own config.json, as from_pretrained would read it
        config = type(config).from_pretrained(directory, local_files_only=True)
        model = cls(config, dtype=compute, _do_init=False)
        shapes = flatten_dict(model.params_shape_tree)
    except Exception as exc:  # composites refuse _do_init=False; API drift: the whole-model run says which
        raise NotStreamable(f"{cls.__name__} cannot be built without parameters: {exc!r}"[:300]) from None
    # BatchNorm models keep {"params": ..., "batch_stats": ...}; the others the parameters alone
    collections = ("params", "batch_stats") if {k[0] for k in shapes} == {"params", "batch_stats"} else ()
    stored = _stored_names(cls, weights, shapes, collections)
    paths = {tuple(u.split(".")): u for u in [*blocks, *leaves]}
    owned: dict[str, list[Key]] = {u: [] for u in paths.values()}
    resident: list[Key] = []
    for key in shapes:
        inner = key[1:] if collections else key
        unit = next((paths[inner[:n]] for n in range(len(inner) - 1, 0, -1) if inner[:n] in paths), None)
        (owned[unit] if unit is not None else resident).append(key)
    if not all(owned[b] for b in blocks):
        raise NotStreamable(f"the Flax model has no parameters under {next(b for b in blocks if not owned[b])}")
    load = _loader(weights, dtype)
    # a streamed unit's parameters are shapes without data (jax.ShapeDtypeStruct) in the bound tree:
    # a module that builds its parameters in setup (nn.Embed) fetches them, and checks their shape,
    # before its call is intercepted; any other use of one fails instead of computing with it
    params = _tree({**{key: jax.ShapeDtypeStruct(shapes[key].shape, shapes[key].dtype)
                       for unit in leaves for key in owned[unit]},
                    **{key: load(stored[key]) for key in resident}})
    for coll in collections:  # the model's __call__ indexes both collections
        params.setdefault(coll, {})
    recorded: dict[str, Any] = {}
    streamed: set[str] = set()
    inside: list[Key] = []

    def intercept(call: Any, args: Any, kwargs: Any, context: Any) -> Any:
        if context.method_name != "__call__":
            return call(*args, **kwargs)
        path = (inside[-1] if inside else ()) + tuple(context.module.path)
        if not inside and path in paths:
            block = paths[path]
            variables = _variables({k: load(stored[k]) for k in owned[block]}, collections, len(path))
            inside.append(path)
            try:
                # jax dispatches asynchronously: wait, or the next blocks load while this one's
                # parameters are still held by queued work, and memory grows with depth again
                out = jax.block_until_ready(context.module.clone(parent=None).apply(variables, *args, **kwargs))
            finally:
                inside.pop()
            streamed.add(block)  # a block or a leaf unit
        else:
            out = call(*args, **kwargs)
        first = first_array(out)
        name = ".".join(path)
        if first is not None and name not in recorded:
            recorded[name] = _numpy(first)
        return out

    try:
        with nn.intercept_methods(intercept):
            out = model(**flax_kwargs(cls, inputs), params=params)
        outputs = flax_outputs(out)
    except NotStreamable:
        raise
    except Exception as exc:  # a parameter read outside its block, or the model itself fails: run it whole
        shown = str(exc).splitlines()[0][:200] if str(exc) else repr(exc)
        raise NotStreamable(f"streamed Flax pass failed: {shown}") from exc
    if not set(blocks) <= streamed:
        raise NotStreamable(f"Flax never called block {sorted(set(blocks) - streamed)[0]}")
    return outputs, recorded


def _stored_names(cls: Any, weights: CheckpointWeights, shapes: dict[Key, Any],
                  collections: tuple[str, ...]) -> dict[Key, str]:
    """Each parameter's stored name, with transformers' prefix rule applied per collection."""
    names = {"/".join(k): k for k in shapes}
    if collections:  # the prefix sits under each collection: decide it collection by collection
        naming: dict[str, str | None] = {}
        for coll in collections:
            head = coll + "/"
            inner = {n[len(head):] for n in names if n.startswith(head)}
            kept = {n[len(head):] for n in weights.tensors if n.startswith(head)}
            for name, stored in stored_naming(inner, kept, cls.base_model_prefix, "/").items():
                naming[head + name] = None if stored is None else head + stored
    else:
        naming = weights.naming(set(names), cls.base_model_prefix)
    result = {}
    for name, key in names.items():
        stored = naming[name]
        if stored is None:
            raise NotStreamable(f"{name} is not in the checkpoint")
        if weights.shape(stored) != tuple(shapes[key].shape):
            raise NotStreamable(f"{stored} has shape {weights.shape(stored)}, the model {tuple(shapes[key].shape)}")
        result[key] = stored
    return result


def _loader(weights: CheckpointWeights, dtype: str) -> Any:
    """F32: floating parameters upcast bit-exactly; otherwise kept as stored (as from_pretrained does).
    The stored copy goes to the device and is dropped before the upcast, each step waited for
    (jax is asynchronous): at most 1.5x the tensor's fp32 size at once, not 2.5x."""
    import jax
    import jax.numpy as jnp

    def load(stored: str) -> Any:
        array = weights.load(stored)
        device = jax.block_until_ready(jnp.asarray(array))
        del array
        if dtype == "F32" and jnp.issubdtype(device.dtype, jnp.floating) and device.dtype != jnp.float32:
            device = jax.block_until_ready(device.astype(jnp.float32))
        return device

    return load


def _tree(flat: dict[Key, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return tree


def _variables(flat: dict[Key, Any], collections: tuple[str, ...], depth: int) -> dict[str, Any]:
    """A block's variables relative to the block: {"params": ...} (and its BatchNorm statistics)."""
    if collections:
        return {coll: _tree({k[1 + depth:]: v for k, v in flat.items() if k[0] == coll})
                for coll in collections if any(k[0] == coll for k in flat)}
    return {"params": _tree({k[depth:]: v for k, v in flat.items()})}


def _numpy(array: Any) -> Any:
    import numpy as np

    return np.asarray(array).astype(np.float32)
