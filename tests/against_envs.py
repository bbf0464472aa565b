"""The environments `parity --against` runs its stacks in, built when missing (as `make test` builds them).

tunix: `.venv-tunix` from constraints-tunix.txt (google-tunix pins safetensors < 0.8).
keras-hub: `.keras-hub`, keras-hub alone (--no-deps) beside this venv.
easydel: `.venv-easydel` from constraints-easydel.txt (jax 0.9, flax 0.12.3, transformers 5.5).  A failed build fails the
test with the make target to run: nothing is skipped silently.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _build(stamp: Path, newer_than: Path | None, steps: list[list[str]], make_target: str) -> None:
    if stamp.exists() and (newer_than is None or stamp.stat().st_mtime >= newer_than.stat().st_mtime):
        return
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=1800, cwd=ROOT)
        if proc.returncode != 0:
            raise AssertionError(f"could not build {stamp.parent} (run `{make_target}`): {' '.join(step[:6])}: "
                                 f"{' '.join(proc.stderr.split()[-40:])}")
    stamp.touch()


def ensure(target: str) -> None:
    if target == "tunix":
        venv = ROOT / ".venv-tunix"
        _build(venv / ".installed", ROOT / "constraints-tunix.txt",
               [[sys.executable, "-m", "venv", str(venv)],
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", "constraints-tunix.txt",
                 "google-tunix", "jax", "flax", "torch"]], "make tunix-venv")
    elif target == "easydel":
        venv = ROOT / ".venv-easydel"
        _build(venv / ".installed", ROOT / "constraints-easydel.txt",
               [[sys.executable, "-m", "venv", str(venv)],
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", "constraints-easydel.txt",
                 "easydel", "Pillow", "torch"]], "make easydel-venv")
    elif target == "keras-hub":
        folder = ROOT / ".keras-hub"
        _build(folder / ".installed", None,
               [[sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(folder),
                 "keras-hub==0.32.0"]], "make keras-hub-lib")
    else:
        raise ValueError(target)
