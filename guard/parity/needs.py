"""Where parity's Flax side runs, known before anything is written.

transformers 5 removed its Flax models (PR #40760).  Parity's PyTorch side runs in this process with
the installed transformers (5.x or 4.x: the version that wrote the source config reads it right); its
Flax side needs transformers 4.x.  It runs here when this transformers has the Flax models, else in the
transformers-4 environment ("tf4", ``guard.envs.registry``) found as every environment is found
(``guard.envs.find``): ``--flax-python PATH`` or ``$CKPT_GUARD_FLAX_PYTHON``, asked for its versions first;
this process when its transformers is 4.x; the managed environment `ckpt-guard env install tf4` builds; else
one line naming that command.  ``convert --parity`` asks here before it writes, so a missing requirement is
one line and no output, never an output then exit 2.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from guard.envs.find import Found, find, install_hint
from guard.errors import MissingExtraError, UsageError

PARITY_MODULES = ("numpy", "torch", "jax", "flax", "transformers")
TORCH_SIDE_MODULES = ("numpy", "ml_dtypes", "torch")  # this process, when the Flax side runs elsewhere
FLAX_SIDE_MODULES = ("numpy", "jax", "flax", "msgpack", "transformers")  # the transformers-4 environment
FLAX_TRANSFORMERS = "transformers>=4.40,<5"  # the pin that keeps FlaxAutoModel* (4.40: the oldest tested)
FLAX_PYTHON_ENV = "CKPT_GUARD_FLAX_PYTHON"


def installed_transformers() -> str | None:
    """The installed transformers' version, from its metadata (nothing imported); None when absent."""
    if importlib.util.find_spec("transformers") is None:
        return None
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:  # a bare source tree on sys.path: ask the module
        import transformers

        return str(getattr(transformers, "__version__", "0"))


def has_flax_models(version: str) -> bool:
    major = version.split(".")[0]
    return major.isdigit() and int(major) < 5


def require_flax_transformers(what: str = "parity", *, after: str = "") -> None:
    """One line when the installed transformers has no Flax models (absent, or 5 and later)."""
    for module in PARITY_MODULES[:-1]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, "parity")
    version = installed_transformers()
    if version is None or not has_flax_models(version):
        found = f"transformers 5 removed them; found {version}" if version else "none is installed"
        raise UsageError(f"{what} needs transformers 4.x, the last line with Flax models ({found}): install it "
                         f"with pip install 'ckpt-guard[parity]' '{FLAX_TRANSFORMERS}', or run ckpt-guard from an "
                         f"environment that has it{after}")


def flax_side_python(named: Path | None = None, what: str = "parity", *, after: str = "") -> Path | None:
    """The Python parity's Flax side runs in: None for this process, else a transformers-4 environment's.

    Raises the one line (MissingExtraError, UsageError) when either side cannot run."""
    found = flax_side(named, what, after=after)
    return None if found.in_process else found.python


def flax_side(named: Path | None = None, what: str = "parity", *, after: str = "") -> Found:
    """Where the Flax side runs (``guard.envs.find``); its version outside the checked set is warned about."""
    for module in TORCH_SIDE_MODULES:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, "parity")
    if installed_transformers() is None:  # the PyTorch side needs transformers too: installing 4.x serves both
        require_flax_transformers(what, after=after)
    found = find("tf4", named, what=what, after=after, also=FLAX_SIDE_MODULES[:-1])
    if found.in_process:
        require_flax_transformers(what, after=after)
    if found.warning:
        sys.stderr.write(f"ckpt-guard: warning: {found.warning}\n")
    return found


def check_worker_transformers(version: str | None, python: Path) -> None:
    """The worker's own transformers, as it imported it: 5 has no Flax models, and a parity asked for that did
    not run is exit 2, never a note and a pass."""
    if not version or not has_flax_models(version):
        raise UsageError(f"parity: the Flax side in {python} imported transformers {version or '(none)'}, which "
                         f"has no Flax models: {install_hint('tf4')}")
