"""keras-hub's own loader and forward, in the worker (KERAS_BACKEND=jax, set by the client).

``keras_hub.models.Backbone.from_preset(local dir)`` converts the HF checkpoint at load
(``keras_hub/src/utils/transformers/convert_<arch>.py``); its ``dtype`` is a Keras dtype policy:
the variables and the computation take it.  The logits are the backbone's hidden states through
its token embedding's ``reverse=True`` projection, as ``CausalLM`` computes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard.worker.loads import run_loads

LIBRARY = "keras-hub"
_POLICY = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


class Loaded:
    def __init__(self, checkpoint: Path, options: dict[str, Any], backbone: Any) -> None:
        self.checkpoint, self.options, self.backbone = checkpoint, options, backbone


def version() -> str:
    import keras_hub

    return str(keras_hub.__version__)


def load(checkpoint: Path, config: dict[str, Any], options: dict[str, Any]) -> Loaded:
    import keras_hub

    return Loaded(checkpoint, options, keras_hub.models.Backbone.from_preset(str(checkpoint), **options))


def parameters(handle: Loaded) -> dict[str, Any]:
    import numpy as np

    return {variable.path: np.asarray(variable.value) for variable in handle.backbone.weights}


def forward(handle: Loaded, dtype: str, input_ids: list[list[int]]) -> Any:
    """The pass computes in ``dtype``: the loaded backbone where its policy is that, else the same load
    under that policy (what a keras-hub user runs to compute in bf16)."""
    import keras_hub
    import numpy as np

    backbone = handle.backbone
    if backbone.dtype_policy.compute_dtype != _POLICY[dtype]:
        backbone = keras_hub.models.Backbone.from_preset(str(handle.checkpoint),
                                                         **{**handle.options, "dtype": _POLICY[dtype]})
    ids = np.asarray(input_ids, dtype="int32")
    hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    logits = backbone.token_embedding(hidden, reverse=True)
    return np.asarray(logits).astype(np.float32)


def answer(request: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    return {"loads": run_loads(request, out_dir, load=load, parameters=parameters, forward=forward)}


def smoke() -> str:
    """What ``ckpt-guard env install keras-hub`` runs before it says ready: the imports this side makes (keras on
    the JAX backend, keras_hub, and sentencepiece, which keras_hub's tokenizers import) and a tiny Qwen3
    backbone's forward through its reversed embedding, as ``forward`` computes logits."""
    import keras
    import keras_hub
    import numpy as np
    import sentencepiece  # noqa: F401

    backbone = keras_hub.models.Qwen3Backbone(vocabulary_size=8, num_layers=1, num_query_heads=2,
                                              num_key_value_heads=1, head_dim=4, hidden_dim=8, intermediate_dim=16)
    ids = np.array([[1, 2, 3]], dtype="int32")
    logits = np.asarray(backbone.token_embedding(backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)}),
                                                 reverse=True))
    if logits.shape != (1, 3, 8) or not np.isfinite(logits).all():
        raise RuntimeError(f"a tiny Qwen3 backbone's logits came back {logits.shape}, not (1, 3, 8) and finite")
    return f"keras {keras.__version__} ({keras.backend.backend()}), keras-hub {keras_hub.__version__}"
