"""Target parameter trees from transformers, built without allocating a single weight.

Flax: ``FlaxModel(config, _do_init=False).params_shape_tree`` (``jax.eval_shape`` of init).
PyTorch: the model built on the ``meta`` device; its state dict has shapes and no data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Key = tuple[str, ...]


@dataclass
class Template:
    shapes: dict[Key, tuple[int, ...]]
    architecture: str  # the class the tree comes from
    prefix: str | None  # transformers' base_model_prefix
    tied: dict[Key, Key] = field(default_factory=dict)  # torch: alias -> the parameter it shares
    buffers: set[Key] = field(default_factory=set)  # torch: state-dict buffers (not parameters)
    ignored: tuple[str, ...] = ()  # regexes of source names transformers itself drops on load


def ignored_on_load(config: Any) -> tuple[str, ...]:
    """The PyTorch class's ``_keys_to_ignore_on_load_unexpected`` (e.g. old rotary ``inv_freq`` buffers)."""
    cls = _model_class(config, flax=False)
    return tuple(getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or ())


def load_config(src: Path) -> Any | None:
    """transformers' config for the model, or None when transformers does not know the model_type."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(src), local_files_only=True)
    except (ValueError, KeyError, OSError):
        return None


def _model_class(config: Any, *, flax: bool) -> Any | None:
    import transformers

    for arch in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, ("Flax" if flax else "") + arch, None)
        if cls is not None:
            return cls
    if flax:
        from transformers.models.auto.modeling_flax_auto import FLAX_MODEL_MAPPING as mapping
    else:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING as mapping
    try:
        return mapping[type(config)]
    except KeyError:
        return None


def flax_template(config: Any) -> Template | None:
    from flax.traverse_util import flatten_dict

    cls = _model_class(config, flax=True)
    if cls is None:
        return None
    model = cls(config, _do_init=False)
    flat = flatten_dict(dict(model.params_shape_tree))
    shapes = {k: tuple(v.shape) for k, v in flat.items()}
    return Template(shapes, cls.__name__, cls.base_model_prefix, ignored=ignored_on_load(config))


def torch_template(config: Any) -> Template | None:
    import torch

    cls = _model_class(config, flax=False)
    if cls is None:
        return None
    with torch.device("meta"):
        model = cls(config)
    state = model.state_dict()
    shapes = {tuple(k.split(".")): tuple(v.shape) for k, v in state.items()}
    owner: dict[int, Key] = {}
    tied: dict[Key, Key] = {}
    declared = {tuple(k.split(".")) for k in (getattr(model, "_tied_weights_keys", None) or ())}
    named = sorted(model.named_parameters(remove_duplicate=False), key=lambda kv: tuple(kv[0].split(".")) in declared)
    for name, param in named:  # transformers' declared tied keys are the aliases, never the owners
        key = tuple(name.split("."))
        if id(param) in owner:
            tied[key] = owner[id(param)]
        else:
            owner[id(param)] = key
    buffers = {tuple(k.split(".")) for k, _ in model.named_buffers()} & set(shapes)
    return Template(shapes, cls.__name__, cls.base_model_prefix, tied, buffers, ignored_on_load(config))
