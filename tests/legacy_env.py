"""The transformers-4 environment: the last transformers line with Flax models (the legacy target).

transformers 5 removed its Flax models (PR #40760).  The development venv runs transformers 5; what needs
transformers 4's Flax classes runs in `.venv-tf4` (built by `make test` from constraints-tf4.txt): the Flax
side of `parity` through the worker protocol, and the tests marked `transformers4` in a pytest run of
their own.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEGACY_VENV = ROOT / ".venv-tf4"


def here_has_flax_transformers() -> bool:
    """This interpreter's transformers still has the Flax models (4.x)."""
    try:
        return int(importlib.metadata.version("transformers").split(".")[0]) < 5
    except importlib.metadata.PackageNotFoundError:
        return False


def legacy_python() -> Path:
    """The Python whose transformers has the Flax models: `.venv-tf4`'s, or this one while it is 4.x."""
    built = LEGACY_VENV / "bin" / "python"
    if built.exists():
        return built
    if here_has_flax_transformers():
        return Path(sys.executable)
    raise AssertionError("no transformers-4 environment: run `make tf4-venv` (make test builds it)")
