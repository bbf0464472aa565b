"""The parent side of the worker protocol: one subprocess per request, whatever the library.

The worker runs with the target's Python, this package's root (and the target's extra library
folder, where it has one) on PYTHONPATH, and a temporary folder it writes its arrays into.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from guard.errors import GuardError
from guard.worker.protocol import PROTOCOL, ProtocolError, check_answer

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent
TIMEOUT_S = 1800


class WorkerFailed(GuardError):
    """The worker exited without an answer; the message ends with its stderr's last lines."""


def run_worker(python: Path, request: dict[str, Any], out_dir: Path, *, extra_path: tuple[Path, ...] = (),
               env: dict[str, str] | None = None) -> dict[str, Any]:
    request = {**request, "protocol": PROTOCOL, "out_dir": str(out_dir)}
    path = os.pathsep.join([str(PACKAGE_ROOT), *map(str, extra_path)])
    environment = {**os.environ, **(env or {}), "PYTHONPATH": path}
    try:
        proc = subprocess.run([str(python), "-m", "guard.worker"], input=json.dumps(request), capture_output=True,
                              text=True, timeout=TIMEOUT_S, env=environment, cwd=str(out_dir))
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
