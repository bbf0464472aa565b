"""Library chatter (transformers' "TensorFlow and JAX classes are deprecated" banner, Python warnings,
jax's platform notes) goes into logging: hidden by default, shown on stderr with ``-v``.

The report is the user's answer; a library's advice about its own future is not part of it, and neither are its
progress bars (transformers' "Loading weights: 0%|", huggingface_hub's downloads): tqdm is off while the context
lasts, in this process and in the workers it starts (they inherit the environment), ``-v`` or not.  ckpt-guard's
own bar (guard.progress) is not tqdm's.  A library's ``print`` goes to stderr with ``-v``, else nowhere: stdout is
the report's (``--format json`` is JSON alone), which ckpt-guard writes to ``report_stdout()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

LIBRARY_LOGGERS = ("transformers", "diffusers", "jax", "absl", "flax", "orbax", "torch", "torchao", "py.warnings",
                   "huggingface_hub", "DeepSpeed")


@contextlib.contextmanager
def quiet_libraries(*, verbose: bool) -> Iterator[None]:
    level = logging.WARNING if verbose else logging.ERROR
    saved_env = os.environ.get("TRANSFORMERS_VERBOSITY")
    os.environ["TRANSFORMERS_VERBOSITY"] = "warning" if verbose else "error"  # read when transformers loads
    saved_bars = {name: os.environ.get(name) for name in NO_BARS}
    os.environ.update(NO_BARS)
    bars = _transformers_bars(False)
    _REPORT_STDOUT.append(sys.stdout)
    sink = None if verbose else open(os.devnull, "w", encoding="utf-8")  # closed when the context ends
    sys.stdout = sys.stderr if sink is None else sink
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
        sys.stdout = _REPORT_STDOUT.pop()
        if sink is not None:
            sink.close()
        for lg in loggers.values():
            lg.__dict__.pop("setLevel", None)
        logging.captureWarnings(False)
        if verbose:
            root.removeHandler(handler)
        for name, (lvl, propagate) in saved.items():
            loggers[name].setLevel(lvl)
            loggers[name].propagate = propagate
        _transformers_verbosity(hf_level)
        _transformers_bars(bars)
        for name, value in saved_bars.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if saved_env is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = saved_env


_REPORT_STDOUT: list[TextIO] = []  # the stdout each open context replaced, innermost last


def report_stdout() -> TextIO:
    """Where ckpt-guard's own report goes: stdout as it was before the libraries were quieted."""
    return _REPORT_STDOUT[0] if _REPORT_STDOUT else sys.stdout


# tqdm reads TQDM_* as its arguments' defaults (4.66+: every bar, transformers' included); huggingface_hub reads
# its own at import; transformers' own switch is set below when it is already loaded (it read the hub's at import)
NO_BARS = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def _transformers_bars(enabled: bool | None) -> bool | None:
    """Turn transformers' tqdm on or off (if transformers is loaded); return whether it was on."""
    hf = sys.modules.get("transformers.utils.logging")
    if hf is None or enabled is None:
        return None
    was = bool(hf.is_progress_bar_enabled())
    if enabled:
        hf.enable_progress_bar()
    else:
        hf.disable_progress_bar()
    return was


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
