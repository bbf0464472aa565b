"""What "never a hang, never a huge allocation" means in the tests.  Not a test module.

Speed is not asserted here: ``bench/`` measures it.  A test of hostile input
asserts behaviour, with bounds that hold on a loaded two-core CI machine:

* ``no_hang``: an alarm in the main thread.  A header scan of a small file
  takes milliseconds; one still running after ``HANG_SECONDS`` is looping.
* ``traced``: the tracemalloc peak of a block, always stopped afterwards, so a
  failing assertion cannot leave tracing on (and its peak) for the next test.
"""

from __future__ import annotations

import signal
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

HANG_SECONDS = 10.0


class ScanHang(Exception):
    pass


@contextmanager
def no_hang(seconds: float = HANG_SECONDS) -> Iterator[None]:
    """Raise ScanHang in the main thread after ``seconds``: a hang becomes a failure."""

    def fire(_signum: int, _frame: object) -> None:
        raise ScanHang(f"still running after {seconds}s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Peak:
    bytes: int = 0


@contextmanager
def traced() -> Iterator[Peak]:
    """The peak of Python allocations inside the block, in ``peak.bytes`` once it ends."""
    if tracemalloc.is_tracing():  # left on by someone else: start from nothing
        tracemalloc.stop()
    peak = Peak()
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
