"""How the Hub client waits: ``Retry-After``, jittered exponential back-off, a token bucket.

Pure policy, no HTTP: ``retry_after_seconds`` reads the header (seconds or an
HTTP date), ``Backoff`` says how long to wait before attempt *n* and when to
give up (attempts and a total deadline), and ``RateLimiter`` spaces requests
so that all threads of one process together stay under ``rate`` per second.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

from guard.records import Record

MAX_RETRY_AFTER = 3600.0  # a Retry-After beyond an hour is not waited for


def retry_after_seconds(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, from ``Retry-After`` (delay-seconds or an HTTP date)."""
    if not headers:
        return None
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None  # unparsable: fall back to our own back-off
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        return None
    wait = when.timestamp() - (time.time() if now is None else now)
    return min(max(wait, 0.0), MAX_RETRY_AFTER)


MAX_ASKED_TO_WAIT = 100  # attempts after which even a server that keeps sending Retry-After is given up on


class Backoff(Record):
    """Attempts, the first wait (doubling after, capped, jittered) and a total deadline.

    The one back-off schedule of the Hub code: ``HubClient.call`` waits by it between
    attempts of a request (+-50 % jitter), the reviewer between attempts of a failed job
    (``jitter=(0.5, 1.0)``: never past the cap, which is an hour there).
    ``attempts`` bounds the failures we time ourselves; a server that says when
    to come back (Retry-After) is bounded by the deadline instead.
    """

    attempts: int = 6
    base: float = 0.5
    cap: float = 30.0
    deadline: float = 300.0
    jitter: tuple[float, float] = (0.5, 1.5)  # the factor's range

    def wait(self, attempt: int, *, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        if retry_after is not None:
            # The server's own figure is a floor; a little jitter spreads the threads that met it.
            return retry_after + random.uniform(0.0, min(0.1 * retry_after, 1.0))
        step = min(self.cap, self.base * 2 ** (max(attempt, 1) - 1))
        return step * random.uniform(*self.jitter)

    def allows(self, attempt: int, wait: float, *, started: float, asked: bool = False) -> bool:
        """Whether another attempt after ``wait`` seconds stays within the attempts and the deadline.

        ``attempt`` counts the failures without Retry-After; ``asked`` says this
        one carried it (then only the deadline and ``MAX_ASKED_TO_WAIT`` apply).
        """
        limit = MAX_ASKED_TO_WAIT if asked else self.attempts
        return attempt < limit and time.monotonic() + wait - started <= self.deadline


class Attempts:
    """One request's failed attempts under a ``Backoff``: those we time ourselves, and those the Hub
    said when to repeat (Retry-After), counted apart as ``Backoff.allows`` bounds them apart."""

    def __init__(self, policy: Backoff) -> None:
        self.policy, self.started = policy, time.monotonic()
        self.timed = self.asked = 0

    def next_wait(self, retry_after: float | None) -> float | None:
        """Seconds to wait before the next attempt, or None when the policy allows no more."""
        if retry_after is None:
            self.timed += 1
            wait = self.policy.wait(self.timed)
            return wait if self.policy.allows(self.timed, wait, started=self.started) else None
        self.asked += 1
        wait = self.policy.wait(self.asked, retry_after=retry_after)
        return wait if self.policy.allows(self.asked, wait, started=self.started, asked=True) else None


class RateLimiter:
    """At most ``rate`` requests per second across threads, evenly spaced (a bucket of one token).

    Each caller reserves the next free slot under the lock and sleeps outside it,
    so waiting threads are served in arrival order and never exceed the rate.
    """

    def __init__(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self._interval = 1.0 / rate
        self._next = 0.0
        self._lock = threading.Lock()
        self.waited = 0.0  # seconds spent waiting, all threads together

    def acquire(self) -> None:
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + self._interval
            self.waited += slot - now
        if slot > now:
            time.sleep(slot - now)
