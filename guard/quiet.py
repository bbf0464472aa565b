"""Library chatter (transformers' "TensorFlow and JAX classes are deprecated" banner, Python warnings,
jax's platform notes) goes into logging: hidden by default, shown on stderr with ``-v``.

The report is the user's answer; a library's advice about its own future is not part of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator

LIBRARY_LOGGERS = ("transformers", "diffusers", "jax", "absl", "flax", "orbax", "torch", "torchao", "py.warnings",
                   "huggingface_hub", "DeepSpeed")


@contextlib.contextmanager
def quiet_libraries(*, verbose: bool) -> Iterator[None]:
    level = logging.WARNING if verbose else logging.ERROR
    saved_env = os.environ.get("TRANSFORMERS_VERBOSITY")
    os.environ["TRANSFORMERS_VERBOSITY"] = "warning" if verbose else "error"  # read when transformers loads
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ckpt-guard: -v: %(name)s: %(message)s"))
    loggers = {name: logging.getLogger(name) for name in LIBRARY_LOGGERS}
    saved = {name: (lg.level, lg.propagate) for name, lg in loggers.items()}
    hf_level = _transformers_verbosity(None)
    _transformers_verbosity(level)
    logging.captureWarnings(True)
    root = logging.getLogger()
    if verbose:
        root.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            for lg in loggers.values():
                lg.setLevel(level)
                _pin_level(lg)
            yield
    finally:
        for lg in loggers.values():
            lg.__dict__.pop("setLevel", None)
        logging.captureWarnings(False)
        if verbose:
            root.removeHandler(handler)
        for name, (lvl, propagate) in saved.items():
            loggers[name].setLevel(lvl)
            loggers[name].propagate = propagate
        _transformers_verbosity(hf_level)
        if saved_env is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = saved_env


def _pin_level(logger: logging.Logger) -> None:
    """Keep the level just set while the context lasts.

    torch, DeepSpeed and others set their logger's level when they are imported, which would win over
    ours (torch's WARNING lets a later import, transformers loading torchao, log pytree deprecations
    onto the user's terminal).  Importing them first to get that over with cost a conversion that
    needs no torch 1.5 to 4.6 s of torch's import; pinning the level costs nothing."""
    logger.setLevel = lambda level: None  # type: ignore[method-assign]  # an instance attribute, removed after


def _transformers_verbosity(level: int | None) -> int | None:
    """Set (and return the previous) verbosity of transformers' own handler, if transformers is loaded."""
    hf = sys.modules.get("transformers.utils.logging")
    if hf is None:
        return None
    previous: int = hf.get_verbosity()
    if level is not None:
        hf.set_verbosity(level)
    return previous
