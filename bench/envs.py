"""Which environment a benchmark measures: the pinned development venv or the latest releases.

`make test` and the benchmarks run in `.venv`, pinned by constraints.txt; users get whatever
`pip install ckpt-guard[...]` resolves today.  `make bench-latest` builds `.venv-latest` the way
users install (`pip install ".[all]"`, no constraints; only torch pinned, to its CPU build) and runs
the benchmarks with its interpreter, so docs/benchmarks.md shows both.  A benchmark run by an
interpreter (or given one with ``--python``) measures that interpreter's environment: its numpy,
ml_dtypes, torch, and its installed ckpt-guard (or the tree's, where the benchmark puts it first
on PYTHONPATH).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LATEST_VENV = ROOT / ".venv-latest"
PACKAGES = ("numpy", "ml_dtypes", "safetensors", "torch", "transformers", "jax")


def versions(python: str = sys.executable) -> dict[str, str]:
    """The installed versions of the packages a scan or a conversion imports, as ``python`` sees them."""
    script = ("import importlib.metadata as m, json, sys\n"
              "out = {}\n"
              "for name in sys.argv[1:]:\n"
              "    try: out[name] = m.version(name)\n"
              "    except m.PackageNotFoundError: out[name] = '-'\n"
              "print(json.dumps(out))")
    done = subprocess.run([python, "-c", script, *PACKAGES], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def is_latest(python: str = sys.executable) -> bool:
    """True for the interpreter of `.venv-latest` (what `make bench-latest` builds)."""
    return Path(python).absolute().parent.parent == LATEST_VENV


def label(python: str = sys.executable) -> str:
    return "latest releases" if is_latest(python) else "pinned (constraints.txt)"


def describe(python: str = sys.executable) -> str:
    """One line: the environment's name and its versions."""
    found = versions(python)
    return f"{label(python)}: " + ", ".join(f"{name} {found[name]}" for name in PACKAGES)


def heading(base: str, python: str = sys.executable) -> str:
    """A docs section's heading for this environment (the latest releases get a section of their own)."""
    return f"{base} (latest releases)" if is_latest(python) else base
