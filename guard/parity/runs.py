"""One forward pass per side: load with transformers, run the seeded inputs, return float32 outputs.

The whole-model path, for models the streamed runs (``guard.parity.stream_torch``) cannot place
exactly: each run loads its model, runs once and lets it go, so peak memory is one model plus the
outputs.  The streamed runs share its forward calls (``torch_forward``, ``flax_kwargs``).  Loading problems
become findings (CG001, CG304), never a model left silently half-random.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from guard.catalogue import make_finding
from guard.findings import Finding
from guard.inventory import display_path

LOAD_FAILURES = (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError)
RUN_FAILURES = (*LOAD_FAILURES, IndexError)
SKIPPED_OUTPUTS = ("past_key_values", "attentions", "cross_attentions")


class Unavailable(Exception):
    """No comparison possible (CG303)."""


class Failed(Exception):
    """A side could not be loaded or run; carries the finding."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.message)
        self.finding = finding


def run_torch(cls: Any, directory: Path, dtype: str, inputs: dict[str, Any]) -> dict[str, Any]:
    torch_dtype = torch_dtype_of(dtype)
    where = display_path(directory)
    try:
        model, info = cls.from_pretrained(directory, torch_dtype=torch_dtype, output_loading_info=True,
                                          attn_implementation="eager", local_files_only=True)
    except LOAD_FAILURES as exc:
        message = f"transformers cannot load {cls.__name__}: {_first_line(exc)}"
        raise Failed(make_finding("CG001", where, message)) from exc
    problems = [f"{len(info[k])} {k.replace('_', ' ')} (e.g. {sorted(map(str, info[k]))[0]})"
                for k in ("missing_keys", "mismatched_keys") if info.get(k)]
    if problems:
        raise Failed(make_finding("CG304", where, f"{cls.__name__}: " + "; ".join(problems)))
    model.eval()
    if dtype == "F32":
        tables_in_fp32(model)
    try:
        return torch_forward(model, torch_dtype, inputs)
    except RUN_FAILURES as exc:  # the loaded weights were checked: the inputs or the library are at fault
        raise Unavailable(f"{cls.__name__} ({dtype}) forward pass failed: {_first_line(exc)}") from exc


def torch_forward(model: Any, torch_dtype: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The seeded inputs the model's ``forward`` takes, every hidden state asked for; float32 outputs."""
    import torch

    accepted = inspect.signature(model.forward).parameters
    kwargs: dict[str, Any] = {}
    for name, value in inputs.items():
        if name in accepted:
            tensor = torch.from_numpy(value.copy())
            kwargs[name] = tensor.to(torch_dtype) if tensor.is_floating_point() else tensor.long()
    flags = {"output_hidden_states": True, "return_dict": True, "use_cache": False}
    kwargs.update({k: v for k, v in flags.items() if _takes(accepted, k)})
    with torch.no_grad():
        out = model(**kwargs)
    return {name: value.detach().float().numpy() for name, value in _flatten(out)}


def torch_dtype_of(dtype: str) -> Any:
    import torch

    return {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[dtype]


def flax_dtype_of(dtype: str) -> Any:
    import jax.numpy as jnp

    return {"F32": jnp.float32, "BF16": jnp.bfloat16, "F16": jnp.float16}[dtype]


def tables_in_fp32(model: Any) -> None:
    """The fp32 reference computes its frozen sinusoidal tables in fp32, as Flax does.

    Marian, Pegasus and RoFormer store the table as a weight, so a bf16 checkpoint holds it
    rounded to bf16, and upcasting that copy is not PyTorch in fp32 (Flax computes it from the
    config in fp32: 1.8e-3 of the output's scale apart at layer 0).  transformers' own
    ``_init_weight`` rebuilds it in the model's dtype; for an fp32 checkpoint that is the saved
    table bit for bit.  Flax never holds these tables, so no converted weight is bypassed."""
    for module in model.modules():
        if type(module).__name__.endswith("SinusoidalPositionalEmbedding") and hasattr(module, "_init_weight"):
            module._init_weight()


def run_flax(cls: Any, directory: Path, dtype: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """``dtype`` F32 upcasts every floating parameter bit-exactly; otherwise params stay as stored."""
    import jax
    import jax.numpy as jnp
    from flax.traverse_util import flatten_dict

    compute = flax_dtype_of(dtype)
    where = display_path(directory)
    try:
        model, params = _load_flax(cls, directory, compute)
    except TypeError as exc:  # raised by tracing the module's code (jax.eval_shape): API drift
        raise Unavailable(f"{cls.__name__} does not run with the installed jax/flax: {_first_line(exc)}") from exc
    except LOAD_FAILURES as exc:
        message = f"transformers cannot load {cls.__name__}: {_first_line(exc)}"
        raise Failed(make_finding("CG001", where, message)) from exc
    missing = sorted("/".join(k) for k in model.required_params - set(flatten_dict(params)))
    if missing:
        raise Failed(make_finding("CG304", where, f"{cls.__name__}: {len(missing)} missing keys (e.g. {missing[0]})"))
    if getattr(model, "_guard_randomized", None):
        raise Failed(make_finding("CG304", where, f"{cls.__name__}: {model._guard_randomized}"))
    if dtype == "F32":
        params = jax.tree_util.tree_map(
            lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    try:
        out = model(**flax_kwargs(cls, inputs), params=params)
    except TypeError as exc:  # an API drift between transformers' Flax code and the installed jax
        raise Unavailable(f"{cls.__name__} does not run with the installed jax/flax: {_first_line(exc)}") from exc
    except RUN_FAILURES as exc:  # the loaded weights were checked: the inputs or the library are at fault
        raise Unavailable(f"{cls.__name__} ({dtype}) forward pass failed: {_first_line(exc)}") from exc
    return flax_outputs(out)


def flax_kwargs(cls: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The seeded inputs the Flax ``__call__`` takes, every hidden state asked for, train off."""
    import jax.numpy as jnp

    accepted = inspect.signature(cls.__call__).parameters
    kwargs: dict[str, Any] = {name: jnp.asarray(value) for name, value in inputs.items() if name in accepted}
    if "input_values" in inputs and "input_values" not in accepted and "inputs" in accepted:
        kwargs["inputs"] = jnp.asarray(inputs["input_values"])  # FlaxSpeechEncoderDecoderModel's name for it
    flags = {"output_hidden_states": True, "return_dict": True, "train": False}
    kwargs.update({k: v for k, v in flags.items() if _takes(accepted, k)})  # the call's flags beside its arrays
    return kwargs


def flax_outputs(out: Any) -> dict[str, Any]:
    import numpy as np

    return {name: np.asarray(value).astype(np.float32) for name, value in _flatten(out)}


def _load_flax(cls: Any, directory: Path, compute: Any) -> tuple[Any, Any]:
    """``_do_init=False`` (a missing parameter stays missing); composites refuse it, so they load
    initialised and transformers' "newly initialized" line is caught instead of printed."""
    import logging

    from transformers.utils import logging as hf_logging

    try:
        return cls.from_pretrained(directory, _do_init=False, dtype=compute, local_files_only=True)
    except ValueError as exc:
        if "_do_init" not in str(exc):
            raise
    lines: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, level = Catch(logging.WARNING), hf_logging.get_verbosity()
    hf_logging.disable_default_handler()
    hf_logging.get_logger("transformers").addHandler(handler)
    hf_logging.set_verbosity_warning()
    try:
        model = cls.from_pretrained(directory, dtype=compute, local_files_only=True)
    finally:
        hf_logging.get_logger("transformers").removeHandler(handler)
        hf_logging.set_verbosity(level)
        hf_logging.enable_default_handler()
    random = [line.splitlines()[0][:300] for line in lines if "newly initialized" in line]
    model._guard_randomized = random[0] if random else None
    return model, model.params


def _takes(parameters: Any, name: str) -> bool:
    """Named, or swallowed by ``**kwargs`` (transformers >= 4.56 passes output flags that way)."""
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _flatten(outputs: Any) -> list[tuple[str, Any]]:
    """``logits``, ``hidden_states.0``, ...: every array output, nested tuples numbered."""
    flat: list[tuple[str, Any]] = []

    def walk(name: str, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, tuple | list):
            for i, item in enumerate(value):
                walk(f"{name}.{i}", item)
        elif hasattr(value, "shape"):
            flat.append((name, value))

    for key, value in outputs.items():
        if key not in SKIPPED_OUTPUTS:
            walk(key, value)
    return flat


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars; transformers' log lines are the CLI's to show (-v) or hide (guard.quiet)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()  # HF_HUB_DISABLE_PROGRESS_BARS may have them off
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
