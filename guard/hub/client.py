"""The one door to the Hub: huggingface_hub's own client, honoured rate limits, one-line errors.

huggingface_hub is an extra and is imported here, inside functions.  0.3x talks
through ``requests``, 1.x through ``httpx`` and 2.x through ``httpx2``: this
module uses public ``HfApi`` methods plus ``get_session()`` for ranged GETs, which
exists on all three, and names the transport errors of whichever is installed.

Every call goes through ``HubClient.call``: one token of the shared rate
limiter per attempt, then a retry on 429/503 after the server's ``Retry-After``
(seconds or an HTTP date) or on other 5xx and transport errors after jittered
exponential back-off, within a number of attempts and a total deadline
(``guard.hub.retry``).  Writes pass ``retry=retry_refused``: they are repeated
only after an answer that says the request was refused before it was handled.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from guard import jsonload
from guard.errors import MissingExtraError
from guard.hub.errors import HubError, hub_errors, status_of, transport_errors
from guard.hub.retry import Attempts, Backoff, RateLimiter, retry_after_seconds

T = TypeVar("T")
__all__ = ["HubClient", "HubError", "hub_errors", "retry_read", "retry_refused"]
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
ATTEMPTS = 6
BACKOFF = 0.5  # seconds before the 2nd attempt; doubles after, +-50 % jitter (tests set 0)
BACKOFF_CAP = 30.0
DEADLINE = 300.0  # seconds one call may spend, retries and Retry-After waits included


def hub_module() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise MissingExtraError("huggingface_hub", "hub") from None
    return huggingface_hub


def retry_after_of(exc: BaseException) -> float | None:
    return retry_after_seconds(getattr(getattr(exc, "response", None), "headers", None))


def request_url_of(exc: BaseException) -> str:
    request = getattr(getattr(exc, "response", None), "request", None)
    return str(getattr(request, "url", "") or "")


def retry_read(exc: BaseException) -> bool:
    """Reads are idempotent: retry every rate limit, 5xx and transport error."""
    status = status_of(exc)
    return status in RETRY_STATUSES if status is not None else isinstance(exc, transport_errors())


def request_method_of(exc: BaseException) -> str:
    request = getattr(getattr(exc, "response", None), "request", None)
    return str(getattr(request, "method", "") or "").upper()


def retry_refused(exc: BaseException) -> bool:
    """Writes: only a 429, or a 503 with Retry-After, says the request was turned away unhandled.

    And only if the refused request is the write itself: a call that posts and
    then reads back (``HfApi.create_discussion`` does) has written already when
    its read is refused.  A 5xx without Retry-After or a lost connection may
    come after the Hub acted, so a write is not repeated then either (the
    reviewer's marker check covers those cases).
    """
    status = status_of(exc)
    refused = status == 429 or (status == 503 and retry_after_of(exc) is not None)
    return refused and request_method_of(exc) not in ("GET", "HEAD")


@dataclass  # mutable: __post_init__ binds api; every call counts its answers in statuses and retried
class HubClient:
    """An ``HfApi`` bound to one endpoint and token, with the retry and rate policy of this tool."""

    token: str | bool | None = None
    timeout: float = 30.0
    attempts: int = field(default_factory=lambda: ATTEMPTS)
    backoff: float = field(default_factory=lambda: BACKOFF)
    deadline: float = field(default_factory=lambda: DEADLINE)
    limiter: RateLimiter | None = None
    observe: Callable[[str], None] | None = None  # called with each answer's status ("2xx", "429", "error")
    endpoint: str = ""
    api: Any = field(init=False, repr=False)
    statuses: Counter[str] = field(init=False, default_factory=Counter)  # every attempt's answer
    retried: Counter[str] = field(init=False, default_factory=Counter)  # attempts repeated, by status
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        hub = hub_module()
        from huggingface_hub import constants

        # Read at call time, not import time, so HF_ENDPOINT/monkeypatched constants apply.
        self.endpoint = (self.endpoint or constants.ENDPOINT).rstrip("/")
        self.api = hub.HfApi(endpoint=self.endpoint, token=self.token)

    def call(self, fn: Callable[[], T], *, retry: Callable[[BaseException], bool] = retry_read) -> T:
        """Run one Hub call; retry it while ``retry`` allows, within the attempts and the deadline."""
        caught = (_hub_http_error(), *transport_errors())
        attempts = Attempts(Backoff(self.attempts, self.backoff, BACKOFF_CAP, self.deadline))
        while True:
            if self.limiter is not None:
                self.limiter.acquire()
            try:
                result = fn()
            except caught as exc:
                status = status_of(exc)
                label = str(status) if status is not None else "error"
                self._count(label)
                if not retry(exc):
                    raise
                wait = attempts.next_wait(retry_after_of(exc) if status in (429, 503) else None)
                if wait is None:
                    raise
                with self._lock:
                    self.retried[label] += 1
                time.sleep(wait)
                continue
            self._count("2xx")
            return result

    def _count(self, label: str) -> None:
        with self._lock:
            self.statuses[label] += 1
        if self.observe is not None:
            self.observe(label)

    def get_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``start..end-1`` of a resolve URL (a 206, or a 200 that is sliced)."""
        status, body = self._get(url, {"Range": f"bytes={start}-{end - 1}"})
        if status == 200:  # the server ignored Range: keep only what was asked
            body = body[start:end]
        if len(body) != end - start:
            raise HubError(f"{url}: the server sent {len(body)} bytes for a {end - start}-byte range")
        return body

    def post_json(self, url: str, payload: Any) -> Any:
        """One POST of a JSON body (one write, one request), retried only when refused unhandled."""
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        headers = build_hf_headers(token=self.token)

        def post() -> Any:
            response = get_session().post(url, json=payload, headers=headers, timeout=self.timeout)
            hf_raise_for_status(response)
            return jsonload.loads(response.content)  # the one reader: an answer that is not JSON, one line

        return self.call(post, retry=retry_refused)

    def get_whole(self, url: str) -> bytes:
        return self._get(url, {})[1]

    def _get(self, url: str, extra: dict[str, str]) -> tuple[int, bytes]:
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        headers = {**build_hf_headers(token=self.token), "Accept-Encoding": "identity", **extra}

        def fetch() -> Any:
            response = get_session().get(url, headers=headers, timeout=self.timeout)
            hf_raise_for_status(response)
            return response

        response = self.call(fetch)
        return int(response.status_code), bytes(response.content)

    def file_url(self, repo_id: str, filename: str, revision: str) -> str:
        from huggingface_hub import hf_hub_url

        url = hf_hub_url(repo_id, filename, revision=revision, endpoint=self.endpoint)
        if not url.startswith(self.endpoint + "/"):
            # hf_hub_url's template is fixed at import from HF_ENDPOINT; keep its path, use our host.
            url = self.endpoint + url[url.index(f"/{repo_id}/resolve/"):]
        return url


def _hub_http_error() -> type[BaseException]:
    from huggingface_hub.errors import HfHubHTTPError

    return HfHubHTTPError
