"""Hub failures as one-line ``HubError``s: what went wrong, where, and what to do.

``hub_errors`` wraps every Hub call of the commands: huggingface_hub's own
exceptions and the transport errors of whichever HTTP library it runs on
become a ``HubError`` that never carries a token, and says whether asking
again could help (``retryable``), which the reviewer's queue uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from guard.errors import GuardError


class HubError(GuardError):
    """The Hub could not be reached, or refused what was asked (exit 2).

    ``retryable`` is False where asking again cannot help (a missing, gated or
    disabled repository, a refused token): the reviewer fails such a job at once.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


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


@contextlib.contextmanager
def hub_errors(repo_id: str, *, revision: str | None = None, endpoint: str = "") -> Iterator[None]:
    """Turn huggingface_hub and transport errors into one-line HubErrors (never a token)."""
    from huggingface_hub import errors

    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        yield
    except errors.GatedRepoError:
        raise HubError(f"{repo_id} is gated: accept its conditions on the Hub, then pass a token "
                       "(--token, HF_TOKEN or `hf auth login`)", retryable=False) from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"repository {repo_id} not found on {endpoint or 'the Hub'}; if it is private, "
                       "pass a token that can read it (--token, HF_TOKEN or `hf auth login`)",
                       retryable=False) from None
    except errors.RevisionNotFoundError:
        # Retryable: a webhook may name a commit a moment before every Hub replica serves it.
        raise HubError(f"revision {revision!r} not found in {repo_id}") from None
    except errors.DisabledRepoError:
        raise HubError(f"repository {repo_id} is disabled on the Hub", retryable=False) from None
    except errors.HfHubHTTPError as exc:
        status = status_of(exc)
        if status in (401, 403):
            raise HubError(f"{where}: the Hub refused access (HTTP {status}); check the token's "
                           "permissions (--token, HF_TOKEN or `hf auth login`)", retryable=False) from None
        if status == 429:
            raise HubError(f"{where}: the Hub kept rate-limiting the requests (HTTP 429) until the retry "
                           "deadline; lower --max-rps or raise --retry-deadline") from None
        raise HubError(f"{where}: the Hub answered HTTP {status} (after retries)") from None
    except errors.OfflineModeIsEnabled:
        raise HubError(f"{where}: HF_HUB_OFFLINE is set; hub commands need the network",
                       retryable=False) from None
    except transport_errors() as exc:
        raise HubError(f"{where}: cannot reach {endpoint or 'the Hub'} ({_brief(exc)}, after retries)") from None


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc).strip() else ""
    kind = type(exc).__name__
    if "timed out" in text.lower() or "timeout" in kind.lower():
        return "timed out"
    return kind
