"""tunix's own loader and forward, in the worker (tunix's venv).

``tunix.models.<arch>.params.create_model_from_safe_tensors(dir, ModelConfig, mode=...)``: the
ModelConfig is built from config.json field by field (tunix's own presets are hard-coded per
model size).  A pass computes in its dtype: the loaded state, upcast exactly for F32, merged into
the same model built with that compute dtype where the model has one (Qwen3's ``dtype``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard.worker.loads import run_loads

LIBRARY = "tunix"
_MODULES = {"llama": "tunix.models.llama3", "qwen3": "tunix.models.qwen3"}


class Loaded:
    def __init__(self, module: str, config: Any, model: Any) -> None:
        self.module, self.config, self.model = module, config, model


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("google-tunix")


def model_config(model_type: str, hf: dict[str, Any], dtype: Any = None) -> Any:
    import importlib

    model_lib = importlib.import_module(_MODULES[model_type] + ".model")
    heads = int(hf["num_attention_heads"])
    fields = dict(num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
                  hidden_dim=hf["intermediate_size"], num_heads=heads,
                  head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
                  num_kv_heads=hf.get("num_key_value_heads", heads), rope_theta=hf.get("rope_theta", 10000.0),
                  norm_eps=hf["rms_norm_eps"])
    if model_type == "qwen3":
        fields["use_tied_embedding"] = bool(hf.get("tie_word_embeddings", False))
        if dtype is not None:
            fields["dtype"] = dtype
    else:
        fields["weight_tying"] = bool(hf.get("tie_word_embeddings", False))
    return model_lib.ModelConfig(**fields)


def load(checkpoint: Path, config: dict[str, Any], options: dict[str, Any]) -> Loaded:
    import importlib

    model_type = config["model_type"]
    if model_type not in _MODULES:
        raise NotImplementedError(f"tunix has no model for model_type {model_type!r} here")
    params = importlib.import_module(_MODULES[model_type] + ".params")
    cfg = model_config(model_type, config)
    return Loaded(model_type, config, params.create_model_from_safe_tensors(str(checkpoint), cfg, **options))


def parameters(handle: Loaded) -> dict[str, Any]:
    import jax
    import numpy as np
    from flax import nnx

    flat = jax.tree_util.tree_flatten_with_path(nnx.state(handle.model, nnx.Param).to_pure_dict())[0]
    return {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): np.asarray(leaf)
            for path, leaf in flat}


def forward(handle: Loaded, dtype: str, input_ids: list[list[int]]) -> Any:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    compute = {"F32": jnp.float32, "BF16": jnp.bfloat16, "F16": jnp.float16}[dtype]
    state = nnx.state(handle.model)
    if dtype == "F32":
        state = jax.tree.map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    module = __import__(_MODULES[handle.module] + ".model", fromlist=["model"])
    cfg = model_config(handle.module, handle.config, compute)
    cls = module.Qwen3 if handle.module == "qwen3" else module.Llama3
    graph = nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(params=0))))[0]
    model = nnx.merge(graph, state)
    tokens = jnp.asarray(input_ids, dtype=jnp.int32)
    batch, length = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), dtype=jnp.bool_)), (batch, length, length))
    logits, _ = model(tokens, positions, None, mask)
    return np.asarray(logits, dtype=np.float32)


def answer(request: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    return {"loads": run_loads(request, out_dir, load=load, parameters=parameters, forward=forward)}
