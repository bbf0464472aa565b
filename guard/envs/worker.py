"""The parent side of the worker protocol: one subprocess per request, whatever the library.

The worker runs with the environment's Python and a temporary folder it writes its arrays into.  Its path
(``PYTHONPATH``) holds a folder that contains this package alone (a link named ``guard`` to it, or a copy
where links cannot be made), then the environment's library folder where it has one: never the folder
above the package, which in an installed ckpt-guard is this environment's whole site-packages and would
put its jax, flax and transformers ahead of the environment's own.

A parent that knows it will ask before it knows what starts the worker first (``Started`` with ``warm``): the
side imports its libraries while the parent does its own work, then reads the request.
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
    with Started(python, out_dir, extra_path=extra_path, env=env) as worker:
        return worker.ask(request)


class Started:
    """A worker started before its request is known, so its imports overlap the parent's own work: with
    ``warm``, the side imports its libraries (its ``warm()``) before it reads stdin.  One process, one request
    (``ask``); ``close`` (or leaving the ``with``) ends one that was never asked."""

    def __init__(self, python: Path, out_dir: Path, *, extra_path: tuple[Path, ...] = (),
                 env: dict[str, str] | None = None, warm: str | None = None) -> None:
        self.python, self.out_dir = python, out_dir
        self._path_dir = tempfile.TemporaryDirectory(prefix="ckpt-guard-path-")
        environment = {**os.environ, **(env or {}),
                       "PYTHONPATH": worker_path(Path(self._path_dir.name), extra_path)}
        argv = [str(python), "-m", "guard.worker", *(("--warm", warm) if warm else ())]
        self._proc: subprocess.Popen[str] | None = None
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=environment, cwd=str(out_dir))
        except OSError as exc:
            self._error = f"{python}: {exc}"

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        python, proc = self.python, self._proc
        if proc is None:
            raise WorkerFailed(self._error)
        request = {**request, "protocol": PROTOCOL, "out_dir": str(self.out_dir)}
        try:
            stdout, stderr = proc.communicate(json.dumps(request), timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.close()
            raise WorkerFailed(f"{python}: {exc}") from None
        finally:
            self._path_dir.cleanup()
        lines = stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = " ".join(stderr.split()[-40:])
            raise WorkerFailed(f"{python} -m guard.worker exited {proc.returncode}: {tail}")
        try:
            return check_answer(json.loads(lines[-1]))
        except json.JSONDecodeError:
            raise WorkerFailed(f"{python} -m guard.worker: its last line is not JSON") from None
        except ProtocolError as exc:
            raise WorkerFailed(f"{python} -m guard.worker: {exc}") from None

    def close(self) -> None:
        """Ends the worker if it still runs (never asked, or timed out), and removes its path folder."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
        self._path_dir.cleanup()

    def __enter__(self) -> Started:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
