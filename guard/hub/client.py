"""The one door to the Hub: huggingface_hub's own client, bounded retries, one-line errors.

huggingface_hub is an extra and is imported here, inside functions.  0.3x talks
through ``requests``, 1.x through ``httpx`` and 2.x through ``httpx2``: this
module uses public ``HfApi`` methods plus ``get_session()`` for ranged GETs, which
exists on all three, and names the transport errors of whichever is installed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from guard.errors import GuardError, MissingExtraError

T = TypeVar("T")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
ATTEMPTS = 3
BACKOFF = 0.5  # seconds before the 2nd attempt; doubles after (tests set 0)


class HubError(GuardError):
    """The Hub could not be reached, or refused what was asked (exit 2)."""


def hub_module() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise MissingExtraError("huggingface_hub", "hub") from None
    return huggingface_hub


def transport_errors() -> tuple[type[BaseException], ...]:
    """Connection and timeout errors of the HTTP library huggingface_hub runs on."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (("requests", "RequestException"), ("httpx", "TransportError"),
                         ("httpx2", "TransportError")):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(getattr(__import__(module), name))
    return tuple(errors)


def status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


@dataclass
class HubClient:
    """An ``HfApi`` bound to one endpoint and token, with the retry policy of this tool."""

    token: str | bool | None = None
    timeout: float = 30.0
    attempts: int = field(default_factory=lambda: ATTEMPTS)
    backoff: float = field(default_factory=lambda: BACKOFF)
    endpoint: str = ""
    api: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        hub = hub_module()
        from huggingface_hub import constants

        # Read at call time, not import time, so HF_ENDPOINT/monkeypatched constants apply.
        self.endpoint = (self.endpoint or constants.ENDPOINT).rstrip("/")
        self.api = hub.HfApi(endpoint=self.endpoint, token=self.token)

    def call(self, fn: Callable[[], T]) -> T:
        """Run one Hub call with bounded retries on 5xx/429 and transport errors."""
        transport = transport_errors()
        hub_http_error = _hub_http_error()
        wait = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except hub_http_error as exc:
                if status_of(exc) not in RETRY_STATUSES or attempt == self.attempts:
                    raise
            except transport:
                if attempt == self.attempts:
                    raise
            time.sleep(wait)
            wait *= 2
        raise AssertionError("unreachable")

    def get_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``start..end-1`` of a resolve URL (a 206, or a 200 that is sliced)."""
        status, body = self._get(url, {"Range": f"bytes={start}-{end - 1}"})
        if status == 200:  # the server ignored Range: keep only what was asked
            body = body[start:end]
        if len(body) != end - start:
            raise HubError(f"{url}: the server sent {len(body)} bytes for a {end - start}-byte range")
        return body

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


@contextlib.contextmanager
def hub_errors(repo_id: str, *, revision: str | None = None, endpoint: str = "") -> Iterator[None]:
    """Turn huggingface_hub and transport errors into one-line HubErrors (never a token)."""
    from huggingface_hub import errors

    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        yield
    except errors.GatedRepoError:
        raise HubError(f"{repo_id} is gated: accept its conditions on the Hub, then pass a token "
                       "(--token, HF_TOKEN or `hf auth login`)") from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"repository {repo_id} not found on {endpoint or 'the Hub'}; if it is private, "
                       "pass a token that can read it (--token, HF_TOKEN or `hf auth login`)") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"revision {revision!r} not found in {repo_id}") from None
    except errors.DisabledRepoError:
        raise HubError(f"repository {repo_id} is disabled on the Hub") from None
    except errors.HfHubHTTPError as exc:
        status = status_of(exc)
        if status in (401, 403):
            raise HubError(f"{where}: the Hub refused access (HTTP {status}); check the token's "
                           "permissions (--token, HF_TOKEN or `hf auth login`)") from None
        raise HubError(f"{where}: the Hub answered HTTP {status} (after retries)") from None
    except errors.OfflineModeIsEnabled:
        raise HubError(f"{where}: HF_HUB_OFFLINE is set; hub commands need the network") from None
    except transport_errors() as exc:
        raise HubError(f"{where}: cannot reach {endpoint or 'the Hub'} ({_brief(exc)}, after retries)") from None


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc).strip() else ""
    kind = type(exc).__name__
    if "timed out" in text.lower() or "timeout" in kind.lower():
        return "timed out"
    return kind
