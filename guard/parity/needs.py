"""What the transformers-4 Flax side needs, known before anything is written.

transformers 5 removed its Flax models (PR #40760): parity's Flax side, and the samples that
transformers' own Flax classes write, need transformers 4.x.  ``convert --parity`` asks here
first, so a missing requirement is one line and no output, never an output then exit 2.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from guard.errors import MissingExtraError, UsageError

PARITY_MODULES = ("numpy", "torch", "jax", "flax", "transformers")
FLAX_TRANSFORMERS = "transformers>=4.40,<5"  # the pin that keeps FlaxAutoModel* (4.40: the oldest tested)


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
