"""The parent side of the worker protocol: one subprocess per request, whatever the library.

The worker runs with the environment's Python and a temporary folder it writes its arrays into.  Its path
(``PYTHONPATH``) holds a folder that contains this package alone (a link named ``guard`` to it, or a copy
where links cannot be made), then the environment's library folder where it has one: never the folder
above the package, which in an installed ckpt-guard is this environment's whole site-packages and would
put its jax, flax and transformers ahead of the environment's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from guard.envs.protocol import PROTOCOL, ProtocolError, check_answer
from guard.errors import GuardError

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the `guard` package itself
TIMEOUT_S = 1800


class WorkerFailed(GuardError):
    """The worker exited without an answer; the message ends with its stderr's last lines."""


def package_only(folder: Path) -> Path:
    """``folder``, holding ``guard`` (a link to this package, else a copy) and nothing else."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        (folder / "guard").symlink_to(PACKAGE_DIR, target_is_directory=True)
    except OSError:  # no symlinks (Windows without the privilege): a copy, a few MB
        shutil.copytree(PACKAGE_DIR, folder / "guard", ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def worker_path(folder: Path, extra_path: tuple[Path, ...] = ()) -> str:
    return os.pathsep.join([str(package_only(folder)), *map(str, extra_path)])


def run_worker(python: Path, request: dict[str, Any], out_dir: Path, *, extra_path: tuple[Path, ...] = (),
               env: dict[str, str] | None = None) -> dict[str, Any]:
    request = {**request, "protocol": PROTOCOL, "out_dir": str(out_dir)}
    with tempfile.TemporaryDirectory(prefix="ckpt-guard-path-") as path_dir:
        environment = {**os.environ, **(env or {}), "PYTHONPATH": worker_path(Path(path_dir), extra_path)}
        try:
            proc = subprocess.run([str(python), "-m", "guard.worker"], input=json.dumps(request),
                                  capture_output=True, text=True, timeout=TIMEOUT_S, env=environment,
                                  cwd=str(out_dir))
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WorkerFailed(f"{python}: {exc}") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " ".join(proc.stderr.split()[-40:])
        raise WorkerFailed(f"{python} -m guard.worker exited {proc.returncode}: {tail}")
    try:
        return check_answer(json.loads(lines[-1]))
    except json.JSONDecodeError:
        raise WorkerFailed(f"{python} -m guard.worker: its last line is not JSON") from None
    except ProtocolError as exc:
        raise WorkerFailed(f"{python} -m guard.worker: {exc}") from None
