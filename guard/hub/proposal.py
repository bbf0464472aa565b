"""The fix pull request on the Hub: its marker, finding it again, and opening it exactly once.

Each proposal carries ``<!-- ckpt-guard-fix:plan=P base=B -->`` in its description (which is
also its commit's message body) and both short hashes in its title: ``P`` hashes the planned
fixes, ``B`` is the commit they were planned from.  Before opening, and again before every
retry of the commit request, the Hub is asked for a pull request of ours carrying the marker,
so a run repeated, a commit refused with 429, or a 429 sent after the Hub had already made
the commit never yields a second pull request.  A commit whose title or message carries the
marker is a fix commit: the reviewer never offers a fix for one (``is_fix_commit``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import quote

from guard import jsonload
from guard.hub.client import BACKOFF_CAP, HubClient, hub_errors, request_url_of, retry_after_of
from guard.hub.errors import HubError, status_of, transport_errors
from guard.hub.retry import Attempts, Backoff
from guard.hub.upload import retry_commit
from guard.records import Record

TITLE_PREFIX = "ckpt-guard: fix "
MARKER_PREFIX = "<!-- ckpt-guard-fix:"
_MARKER = re.compile(r"<!-- ckpt-guard-fix:plan=([0-9a-f]{64}) base=([0-9a-f]{40}) -->")
OPEN = ("open", "draft")  # programmatic pull requests start as drafts
MAX_LOOKED_AT = 50  # our newest fix pull requests whose details are read


def fix_marker(plan: str, base: str) -> str:
    return f"{MARKER_PREFIX}plan={plan} base={base} -->"


def fix_title(plan: str, base: str, count: int) -> str:
    return f"{TITLE_PREFIX}{base[:12]} with {count} change{'s' if count != 1 else ''} [{plan[:12]}]"


def is_fix_commit(title: str, message: str) -> bool:
    return title.startswith(TITLE_PREFIX) or MARKER_PREFIX in message


class Proposal(Record):
    num: int
    status: str  # open, draft, merged, closed
    url: str
    plan: str
    base: str

    @property
    def is_open(self) -> bool:
        return self.status in OPEN


def find_proposals(client: HubClient, repo_id: str, author: str, *, plan: str | None = None,
                   base: str | None = None) -> list[Proposal]:
    """Our fix pull requests on ``repo_id`` (newest first) whose marker names ``plan`` and/or ``base``."""
    api = client.api
    with hub_errors(repo_id, endpoint=client.endpoint):
        listed = client.call(lambda: list(api.get_repo_discussions(repo_id, author=author,
                                                                   discussion_type="pull_request")))
        wanted = [d for d in listed if d.author == author and d.title.startswith(TITLE_PREFIX)
                  and (plan is None or f"[{plan[:12]}]" in d.title)
                  and (base is None or f" of {base[:12]} " in d.title)]
        found = []
        for discussion in wanted[:MAX_LOOKED_AT]:
            details = client.call(partial(api.get_discussion_details, repo_id, discussion.num))
            opening = str(getattr(details.events[0], "content", "") or "") if details.events else ""
            match = _MARKER.search(opening)
            if match is None or (plan and match.group(1) != plan) or (base and match.group(2) != base):
                continue
            found.append(Proposal(details.num, str(details.status), _url(client, repo_id, details.num),
                                  match.group(1), match.group(2)))
    return found


def head_commit(client: HubClient, repo_id: str, revision: str) -> tuple[str, str]:
    """(title, message) of ``revision``'s commit: one request, the first page of its history."""
    url = f"{client.endpoint}/api/models/{quote(repo_id, safe='/')}/commits/{quote(revision, safe='')}"
    with hub_errors(repo_id, revision=revision, endpoint=client.endpoint):
        history = jsonload.loads(client.get_whole(url))
    if not isinstance(history, list) or not history or not isinstance(history[0], dict):
        raise HubError(f"{repo_id}@{revision}: the Hub listed no commit")
    return str(history[0].get("title") or ""), str(history[0].get("message") or "")


def open_once(client: HubClient, repo_id: str, operations: list[Any], *, title: str, description: str,
              branch: str, parent: str, plan: str, existing: Callable[[], Proposal | None]) -> Proposal:
    """One ``create_commit(create_pr=True)``; asks ``existing()`` first and before each retry.

    The requests before the commit (preupload, YAML validation) are retried as reads.  The commit
    request is retried only when it was refused unhandled (429, or 503 with Retry-After), and
    only after ``existing()`` says no pull request of ours carries the marker: when the refusal
    came after the Hub had made the commit, that pull request is the answer.  Any other failure
    of the commit request is reported, once ``existing()`` has found nothing either.
    """
    from huggingface_hub.errors import HfHubHTTPError

    api = client.api
    attempts = Attempts(Backoff(client.attempts, client.backoff, BACKOFF_CAP, client.deadline))
    while True:
        found = existing()
        if found is not None:
            return found
        try:
            info = client.call(lambda: api.create_commit(
                repo_id, operations, commit_message=title, commit_description=description, revision=branch,
                create_pr=True, parent_commit=parent), retry=_before_the_commit)
        except (HfHubHTTPError,) + transport_errors() as exc:
            refused = status_of(exc) == 429 or (status_of(exc) == 503 and retry_after_of(exc) is not None)
            if not refused or "/commit/" not in request_url_of(exc):
                found = existing()
                if found is not None:
                    return found
                with hub_errors(repo_id, revision=branch, endpoint=client.endpoint):
                    raise
            wait = attempts.next_wait(retry_after_of(exc))
            if wait is None:
                with hub_errors(repo_id, revision=branch, endpoint=client.endpoint):
                    raise
            time.sleep(wait)
            continue
        num = _pr_num(getattr(info, "pr_url", None) or "")
        return Proposal(num, "draft", str(getattr(info, "pr_url", "") or _url(client, repo_id, num)), plan, parent)


def _before_the_commit(exc: BaseException) -> bool:
    """``HubClient.call`` retries what comes before the commit request; ``open_once`` the commit itself."""
    return "/commit/" not in request_url_of(exc) and retry_commit(exc)


def _pr_num(url: str) -> int:
    tail = url.rstrip("/").rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _url(client: HubClient, repo_id: str, num: int) -> str:
    return f"{client.endpoint}/{repo_id}/discussions/{num}"
