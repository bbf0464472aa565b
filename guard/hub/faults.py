"""A crash on purpose, for the kill tests: ``CKPT_GUARD_KILL_AT=POINT:N``.

The webhook service calls ``reached(POINT)`` at the moments where a crash
matters (before and after a delivery is enqueued, in the middle of a review,
after the answer is posted but before the job is marked done).  When the
variable names that point, the process sends itself SIGKILL the N-th time it
gets there: no clean-up, no ``finally``, exactly what a kill -9, an OOM kill
or a lost machine does.  Unset, this is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = ("before-enqueue", "after-enqueue", "mid-scan", "after-answer")
ENV = "CKPT_GUARD_KILL_AT"
_hits: dict[str, int] = {}
_lock = threading.Lock()


def reached(point: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name != point:
        return
    with _lock:
        _hits[point] = _hits.get(point, 0) + 1
        if _hits[point] >= int(count or 1):
            os.kill(os.getpid(), signal.SIGKILL)


def validate() -> None:
    """Refuse a misspelt point at start-up, rather than a test that waits for a crash forever."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name not in POINTS or not (count or "1").isdigit():
        from guard.errors import UsageError

        raise UsageError(f"{ENV}={spec!r}: expected POINT[:N] with POINT one of {', '.join(POINTS)}")
