"""EasyDeL's own loader and forward, in the worker (EasyDeL's venv: it pins jax ~= 0.9, flax 0.12.3).

``AutoEasyDeLModelForCausalLM.from_pretrained(dir, from_torch=True, ...)`` converts the HF checkpoint at
load through transformers' PyTorch class (``easydel/infra/mixins/bridge.py``: ``_from_torch_pretrained``;
its ``torch_load_mode`` "full" loads with ``torch_dtype=torch.float16``).  A pass computes in its dtype:
the same load with ``dtype``, ``param_dtype`` and ``attn_dtype`` that dtype (EasyDeL's default
attention dtype is bf16), called under the model's own mesh.  The exact load also passes config.json's
``rope_parameters["rope_theta"]`` as ``config_kwargs``: EasyDeL reads rope_theta at the top level only
(``guard.against.easydel_causes`` names it on the forward findings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard.targets.table import ROPE_THETA_FROM_FILE
from guard.worker.loads import run_loads

LIBRARY = "easydel"


class Loaded:
    def __init__(self, checkpoint: Path, options: dict[str, Any], model: Any) -> None:
        self.checkpoint, self.options, self.model = checkpoint, options, model


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("easydel")


def _load(checkpoint: Path, options: dict[str, Any]) -> Any:
    import easydel

    return easydel.AutoEasyDeLModelForCausalLM.from_pretrained(str(checkpoint), from_torch=True,
                                                               auto_shard_model=False, verbose=False, **options)


def nested_rope_theta(config: dict[str, Any]) -> float | None:
    """rope_theta where only transformers 5's layout has it (inside rope_parameters), else None."""
    if "rope_theta" in config:
        return None
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    return float(theta) if isinstance(theta, (int, float)) else None


def library_options(config: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The load's options as EasyDeL takes them: ours (rope_theta from the file) turned into config_kwargs."""
    options = dict(options)
    theta = nested_rope_theta(config) if options.pop(ROPE_THETA_FROM_FILE, False) else None
    if theta is not None:
        options["config_kwargs"] = {**options.get("config_kwargs", {}), "rope_theta": theta}
    return options


def load(checkpoint: Path, config: dict[str, Any], options: dict[str, Any]) -> Loaded:
    options = library_options(config, options)
    return Loaded(checkpoint, options, _load(checkpoint, options))


def parameters(handle: Loaded) -> dict[str, Any]:
    import jax
    import numpy as np
    from flax import nnx

    flat = jax.tree_util.tree_flatten_with_path(nnx.state(handle.model, nnx.Param).to_pure_dict())[0]
    return {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): np.asarray(leaf)
            for path, leaf in flat}


def forward(handle: Loaded, dtype: str, input_ids: list[list[int]]) -> Any:
    import jax.numpy as jnp
    import numpy as np

    compute = {"F32": jnp.float32, "BF16": jnp.bfloat16, "F16": jnp.float16}[dtype]
    config_kwargs = {**handle.options.get("config_kwargs", {}), "attn_dtype": compute, "attn_softmax_dtype": compute,
                     "kvdtype": compute, "attn_mechanism": "vanilla"}
    model = _load(handle.checkpoint, {**handle.options, "dtype": compute, "param_dtype": compute,
                                      "config_kwargs": config_kwargs})
    with model.mesh:
        out = model(input_ids=jnp.asarray(input_ids, dtype=jnp.int32))
    return np.asarray(out.logits, dtype=np.float32)


def answer(request: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    return {"loads": run_loads(request, out_dir, load=load, parameters=parameters, forward=forward)}
