"""May this token open a pull request on this repository?  Asked before anything is downloaded.

``whoami-v2`` names the token's account and its role: a ``read`` token can open nothing, a
``write`` token can open pull requests on every repository it can see, and a fine-grained
token needs ``repo.write`` or ``discussion.write`` (pull requests are discussions), globally or
scoped to the repository, its user or its organisation.  An answer of unknown shape (an OAuth
token, a role added later) is let through: the Hub refuses the write itself then.  The
request is a plain GET through ``HubClient`` (not ``HfApi.whoami``, whose 401 is a bare
``requests`` error on 0.3x), so every huggingface_hub version fails the same way.
"""

from __future__ import annotations

from typing import Any

from guard import jsonload
from guard.hub.client import HubClient, hub_errors
from guard.hub.errors import HubError, status_of
from guard.records import Record

WRITE_PERMISSIONS = frozenset({"repo.write", "discussion.write"})
ASK_FOR_A_TOKEN = "pass a token with write access (--token, HF_TOKEN or `hf auth login`)"


class Identity(Record):
    name: str  # the token's account: the author of what it opens
    role: str  # "read", "write", "fineGrained", or what the Hub said ("unknown" when it said nothing)


def whoami(client: HubClient) -> tuple[Identity, dict[str, Any]]:
    """The token's account and role, and the Hub's whole answer; no or a refused token: a HubError."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import HfHubHTTPError

    if client.token is False or (client.token is None and not get_token()):
        raise HubError(f"no Hub token: a pull request on {client.endpoint} needs one; {ASK_FOR_A_TOKEN}",
                       retryable=False)
    with hub_errors("whoami", endpoint=client.endpoint):
        try:
            data = client.get_whole(f"{client.endpoint}/api/whoami-v2")
        except HfHubHTTPError as exc:
            if status_of(exc) != 401:
                raise
            raise HubError(f"the Hub at {client.endpoint} refused the token (invalid or expired); "
                           f"{ASK_FOR_A_TOKEN}", retryable=False) from None
    try:
        answer = jsonload.loads(data)
    except ValueError:
        raise HubError(f"{client.endpoint}/api/whoami-v2 did not answer JSON") from None
    if not isinstance(answer, dict):
        raise HubError(f"{client.endpoint}/api/whoami-v2 did not answer an object")
    auth = answer.get("auth")
    token = auth.get("accessToken") if isinstance(auth, dict) else None
    role = str(token.get("role")) if isinstance(token, dict) and token.get("role") else "unknown"
    return Identity(str(answer.get("name") or ""), role), answer


def require_pull_request_access(client: HubClient, repo_id: str) -> Identity:
    """The identity, once the token is known to be able to open a pull request on ``repo_id``."""
    identity, answer = whoami(client)
    if not identity.name:  # our pull requests are found again by their author: without it, never open one
        raise HubError(f"{client.endpoint}/api/whoami-v2 named no account for the token; cannot tell our own "
                       "pull requests apart", retryable=False)
    refusal = refusal_of(answer, repo_id)
    if refusal:
        raise HubError(f"{repo_id}: the token of {identity.name or 'this account'} cannot open a pull request "
                       f"there ({refusal}); {ASK_FOR_A_TOKEN}", retryable=False)
    return identity


def refusal_of(answer: dict[str, Any], repo_id: str) -> str:
    """Why the token cannot open a pull request on ``repo_id``; empty when it can (or when unknown)."""
    auth = answer.get("auth")
    token = auth.get("accessToken") if isinstance(auth, dict) else None
    if not isinstance(token, dict):
        return ""
    role = token.get("role")
    if role == "read":
        return "a read-only token"
    grants = token.get("fineGrained")
    if role != "fineGrained" or not isinstance(grants, dict):
        return ""
    if WRITE_PERMISSIONS & set(_strings(grants.get("global"))):
        return ""
    namespace = repo_id.split("/", 1)[0]
    for scope in grants.get("scoped") or []:
        entity = scope.get("entity") if isinstance(scope, dict) else None
        if not isinstance(entity, dict):
            continue
        kind, name = entity.get("type"), entity.get("name")
        if ((kind == "model" and name == repo_id) or (kind in ("user", "org") and name == namespace)) \
                and WRITE_PERMISSIONS & set(_strings(scope.get("permissions"))):
            return ""
    return "a fine-grained token without repo.write or discussion.write on it"


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
