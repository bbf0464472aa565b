"""MaxText's own loader and forward, in the worker (MaxText's venv: MaxText needs Python >= 3.12).

The checkpoint is a parameter checkpoint written by ``convert --to maxtext`` (``OUT/0/items``); its
``_METADATA`` records the HF config and the row, from which the same MaxText flags ``convert``
prints are derived (``guard.convert.maxtext.flags``: pure Python, importable here).  MaxText loads
it as its users do: ``pyconfig.initialize(base.yml, flags...)`` then
``maxtext/utils/model_creation_utils.py: from_pretrained`` with ``load_parameters_path`` (which
restores through ``checkpointing.load_params_from_path``, casting to ``weight_dtype``).

A load's options are MaxText flags (``weight_dtype=...``); base.yml's defaults are what most users run
(``weight_dtype: float32``, ``dtype: bfloat16``).  A pass computes in its dtype: ``dtype`` is that dtype,
and the F32 pass also sets MaxText's own fp32 switches (``matmul_precision=highest``,
``float32_logits``, ``float32_qk_product``).  One model is built per (load, pass); the F32 pass's model
is the one whose parameters are reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard.worker.loads import run_loads

LIBRARY = "maxtext"
# the same on every pass: no checkpoint writing, no tokenizer, an attention every backend has
_COMMON = ["per_device_batch_size=1", "enable_checkpointing=false", "skip_jax_distributed_system=true",
           "tokenizer_type=huggingface", "tokenizer_path=none", "attention=dot_product"]
_LENGTH = 64  # max_target_length: at least the seeded inputs' length (guard.against.run.SEQ_LEN)
_PASS = {"F32": ["dtype=float32", "matmul_precision=highest", "float32_logits=true", "float32_qk_product=true"],
         "BF16": ["dtype=bfloat16"], "F16": ["dtype=float16"],
         # the drift pass: fp32 at base.yml's matmul_precision (default), what MaxText's users run
         "F32:default": ["dtype=float32", "float32_logits=true", "float32_qk_product=true"]}


class Loaded:
    def __init__(self, checkpoint: Path, flags: list[str], options: dict[str, Any]) -> None:
        self.checkpoint, self.flags, self.options = checkpoint, flags, options
        self.models: dict[str, tuple[Any, Any]] = {}  # pass dtype -> (model, mesh)


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("maxtext")


def checkpoint_flags(items: Path) -> list[str]:
    """The flags ``convert --to maxtext`` printed for this checkpoint, from its own ``_METADATA`` record."""
    from guard.convert.maxtext.flags import maxtext_flags
    from guard.convert.maxtext.ocdbt import read_custom
    from guard.targets.maxtext import ARCHITECTURES

    custom = read_custom(items)
    if custom is None or custom.get("row") not in ARCHITECTURES or not isinstance(custom.get("config"), dict):
        raise ValueError(f"{items}: not a checkpoint written by convert --to maxtext (no ckpt_guard record)")
    return maxtext_flags(ARCHITECTURES[custom["row"]], custom["config"], items=items,
                         scan=bool(custom.get("scan_layers")))


def _build(handle: Loaded, dtype: str) -> tuple[Any, Any]:
    import maxtext
    from maxtext.configs import pyconfig
    from maxtext.utils import model_creation_utils

    if dtype not in handle.models:
        base = str(Path(maxtext.__file__).parent / "configs" / "base.yml")
        work = Path.cwd() / f"maxtext-run-{len(handle.models)}"  # the worker's cwd is the parent's temp folder
        options = [f"{k}={v}" for k, v in handle.options.items()]
        argv = ["", base, *handle.flags, *_COMMON, *_PASS[dtype], *options, "run_name=ckpt-guard",
                f"max_target_length={_LENGTH}", f"max_prefill_predict_length={_LENGTH}",
                f"base_output_directory={work}"]
        handle.models[dtype] = model_creation_utils.from_pretrained(pyconfig.initialize(argv))
    return handle.models[dtype]


def load(checkpoint: Path, config: dict[str, Any], options: dict[str, Any]) -> Loaded:
    handle = Loaded(checkpoint, checkpoint_flags(checkpoint), options)
    _build(handle, "F32")
    return handle


def parameters(handle: Loaded) -> dict[str, Any]:
    import jax
    import numpy as np
    from flax import nnx

    model = next(iter(handle.models.values()))[0]
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param).to_pure_dict())[0]
    return {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): np.asarray(leaf)
            for path, leaf in flat}


def forward_at_default_precision(handle: Loaded, input_ids: list[list[int]]) -> Any:
    """MaxText sets its matmuls' precision from its own flag, not JAX's default: a model built without it."""
    return forward(handle, "F32:default", input_ids)


def forward(handle: Loaded, dtype: str, input_ids: list[list[int]]) -> Any:
    import jax
    import jax.numpy as jnp
    import numpy as np

    ids = jnp.asarray(input_ids, dtype=jnp.int32)
    model, mesh = _build(handle, dtype)
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
    with jax.set_mesh(mesh):
        logits = model(ids, positions, decoder_segment_ids=jnp.ones_like(ids), enable_dropout=False)
    return np.asarray(logits[0] if isinstance(logits, tuple) else logits, dtype=np.float32)


def answer(request: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    return {"loads": run_loads(request, out_dir, load=load, parameters=parameters, forward=forward,
                               forward_at_default_precision=forward_at_default_precision)}
