"""`ckpt-guard hub webhook`: a small Starlette app behind uvicorn.

``POST /webhook`` checks ``X-Webhook-Secret`` (401 missing, 403 wrong), answers
at once and leaves the scan to the ``Reviewer``'s thread pool.  Only
``repo.content`` events on model repositories are acted on, for pushes to a
branch or to ``refs/pr/N`` with a new sha; everything else is acknowledged and
ignored.  ``GET /healthz`` is for deployment probes.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from guard.config import Policy
from guard.errors import MissingExtraError
from guard.hub.client import HubClient
from guard.hub.reviewer import PR_REF, Job, Reviewer

MAX_BODY = 1024 * 1024  # Hub payloads are a few KB


def parse_payload(payload: Any) -> tuple[list[Job] | None, str]:
    """Jobs from a webhook payload (v3), or None and why it is ignored.

    Raises ValueError for a body that is not a webhook payload at all (400).
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("event"), dict):
        raise ValueError("not a Hub webhook payload (no event object)")
    scope = payload["event"].get("scope")
    if not isinstance(scope, str):
        raise ValueError("not a Hub webhook payload (no event.scope)")
    # Unknown sub-scopes count as their parent (Hub docs); other scopes are not ours.
    if scope != "repo.content" and not scope.startswith("repo.content."):
        return None, f"scope {scope!r} is not watched"
    repo = payload.get("repo")
    if not isinstance(repo, dict) or not isinstance(repo.get("name"), str):
        raise ValueError("repo.content payload without repo.name")
    if repo.get("type") != "model":
        return None, f"repository type {repo.get('type')!r} is not scanned"
    jobs = []
    for update in payload.get("updatedRefs") or []:
        if not isinstance(update, dict):
            continue
        ref, sha = update.get("ref"), update.get("newSha")
        if not isinstance(ref, str) or not isinstance(sha, str) or not sha:
            continue  # a deleted ref, or a malformed entry
        if ref.startswith("refs/heads/") or PR_REF.match(ref):
            jobs.append(Job(repo["name"], ref, sha))
    if not jobs:
        return None, "no branch or pull-request ref with a new commit"
    return jobs, ""


def create_app(*, secret: str, reviewer: Reviewer) -> Any:
    try:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route
    except ImportError:
        raise MissingExtraError("starlette", "hub") from None

    expected = secret.encode("utf-8")

    async def webhook(request: Request) -> JSONResponse:
        given = request.headers.get("x-webhook-secret")
        if given is None:
            return JSONResponse({"error": "missing X-Webhook-Secret"}, status_code=401)
        if not hmac.compare_digest(given.encode("latin-1"), expected):
            return JSONResponse({"error": "wrong X-Webhook-Secret"}, status_code=403)
        body = await request.body()
        if len(body) > MAX_BODY:
            return JSONResponse({"error": "payload too large"}, status_code=413)
        try:
            jobs, reason = parse_payload(json.loads(body))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError included
            return JSONResponse({"error": f"bad payload: {str(exc)[:200]}"}, status_code=400)
        if jobs is None:
            return JSONResponse({"status": "ignored", "reason": reason})
        queued = sum(reviewer.submit(job) for job in jobs)
        return JSONResponse({"status": "accepted", "queued": queued, "duplicates": len(jobs) - queued},
                            status_code=202)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", **reviewer.stats()})

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        reviewer.close()  # finish queued scans before exiting

    return Starlette(routes=[Route("/webhook", webhook, methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"])], lifespan=lifespan)


def serve(*, host: str, port: int, secret: str, policy: Policy, token: str | None, timeout: float,
          workers: int) -> None:
    try:
        import uvicorn
    except ImportError:
        raise MissingExtraError("uvicorn", "hub") from None
    reviewer = Reviewer(HubClient(token=token, timeout=timeout), policy, workers=workers)
    uvicorn.run(create_app(secret=secret, reviewer=reviewer), host=host, port=port, log_level="info")
