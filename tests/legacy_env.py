"""The transformers-4 environment: the last transformers line with Flax models (the legacy target).

transformers 5 removed its Flax models (PR #40760).  The development venv runs transformers 5; what needs
transformers 4's Flax classes runs in the managed "tf4" environment (`ckpt-guard env install tf4`, which
`make tf4-venv` runs with CKPT_GUARD_HOME=.envs), found as the tool finds it (``guard.envs.find``): the Flax
side of `parity` through the worker protocol, and the tests marked `transformers4` in a pytest run of their own.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

from guard.envs.find import find_managed
from guard.envs.registry import ENVIRONMENTS

ROOT = Path(__file__).resolve().parent.parent


def here_has_flax_transformers() -> bool:
    """This interpreter's transformers still has the Flax models (4.x)."""
    try:
        return int(importlib.metadata.version("transformers").split(".")[0]) < 5
    except importlib.metadata.PackageNotFoundError:
        return False


def legacy_python() -> Path:
    """The Python whose transformers has the Flax models: the managed tf4 environment's, or this one while it
    is 4.x."""
    found = find_managed(ENVIRONMENTS["tf4"])
    if found is not None:
        return found.python
    if here_has_flax_transformers():
        return Path(sys.executable)
    raise AssertionError("no transformers-4 environment: run `make tf4-venv` (make test builds it)")
