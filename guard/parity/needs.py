"""Where parity's Flax side runs, known before anything is written.

transformers 5 removed its Flax models (PR #40760).  Parity's PyTorch side runs in this process with
the installed transformers (5.x or 4.x: the version that wrote the source config reads it right); its
Flax side needs transformers 4.x.  It runs here when this transformers has the Flax models, else in a
transformers-4 environment of its own through the worker protocol (``guard.parity.legacy_flax``).
That environment is, in order: ``--flax-python PATH``; ``$CKPT_GUARD_FLAX_PYTHON``; this process when
its transformers is 4.x; ``.venv-tf4`` beside the package root (what `make tf4-venv` builds in a
checkout).  A named one is asked for its versions first.  ``convert --parity`` asks here before it
writes, so a missing requirement is one line and no output, never an output then exit 2.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
from pathlib import Path

from guard.errors import MissingExtraError, UsageError

PARITY_MODULES = ("numpy", "torch", "jax", "flax", "transformers")
TORCH_SIDE_MODULES = ("numpy", "ml_dtypes", "torch")  # this process, when the Flax side runs elsewhere
FLAX_SIDE_MODULES = ("numpy", "jax", "flax", "msgpack", "transformers")  # the transformers-4 environment
FLAX_TRANSFORMERS = "transformers>=4.40,<5"  # the pin that keeps FlaxAutoModel* (4.40: the oldest tested)
FLAX_PYTHON_ENV = "CKPT_GUARD_FLAX_PYTHON"
LEGACY_VENV = Path(__file__).resolve().parent.parent.parent / ".venv-tf4"  # a checkout's `make tf4-venv`
PROBE_TIMEOUT_S = 120
# run by the named Python: its version of each module (None: absent), as one JSON line
_PROBE = ("import importlib.metadata as m, importlib.util as u, json\n"
          "def v(n):\n"
          "    if u.find_spec(n) is None: return None\n"
          "    try: return m.version(n)\n"
          "    except m.PackageNotFoundError: return '0'\n"
          f"print(json.dumps({{n: v(n) for n in {FLAX_SIDE_MODULES!r}}}))\n")


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
    for module in TORCH_SIDE_MODULES:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, "parity")
    version = installed_transformers()
    if version is None:  # the PyTorch side needs transformers too: installing 4.x serves both
        require_flax_transformers(what, after=after)
    if named is None and os.environ.get(FLAX_PYTHON_ENV):
        named, label = Path(os.environ[FLAX_PYTHON_ENV]), f"{FLAX_PYTHON_ENV}={os.environ[FLAX_PYTHON_ENV]}"
    else:
        label = f"--flax-python {named}"
    if named is not None:
        return _checked(named, label, what, after)
    if has_flax_models(version):
        require_flax_transformers(what, after=after)
        return None
    built = LEGACY_VENV / "bin" / "python"
    if built.exists():
        return _checked(built, f"{LEGACY_VENV.name} ({built})", what, after)
    raise UsageError(_no_flax_line(what, version, after))


def _checked(python: Path, label: str, what: str, after: str) -> Path:
    """``python`` made absolute (never resolved: a venv's python is a link that must stay the venv's),
    once it answers with transformers 4.x and the Flax side's modules."""
    python = Path(os.path.abspath(python))
    if not python.is_file():
        raise UsageError(f"{what}: {label}: no such file{after}")
    try:
        proc = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        versions = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        raise UsageError(f"{what}: {label} does not run: {exc}{after}") from None
    if not isinstance(versions, dict):
        tail = " ".join(proc.stderr.split()[-20:])
        raise UsageError(f"{what}: {label} does not run (exit {proc.returncode}): {tail}{after}")
    missing = [m for m in FLAX_SIDE_MODULES if not versions.get(m)]
    if missing:
        raise UsageError(f"{what}: {label} has no {', '.join(missing)}: install pip install 'ckpt-guard[parity]' "
                         f"'{FLAX_TRANSFORMERS}' there{after}")
    if not has_flax_models(str(versions["transformers"])):
        raise UsageError(f"{what}: {label} has transformers {versions['transformers']}, which has no Flax models: "
                         f"name a Python whose transformers is 4.x ('{FLAX_TRANSFORMERS}'){after}")
    return python


def _no_flax_line(what: str, version: str, after: str) -> str:
    return (f"{what} needs transformers 4.x for its Flax side, the last line with Flax models (transformers 5 "
            f"removed them; found {version}): name the Python of an environment that has it with --flax-python "
            f"PATH (or {FLAX_PYTHON_ENV}), or install it with pip install 'ckpt-guard[parity]' "
            f"'{FLAX_TRANSFORMERS}'{after}")
