"""`ckpt-guard hub webhook`: a small Starlette app in front of the durable queue.

``POST /webhook`` checks ``X-Webhook-Secret`` first, in constant time and
before a byte of the body is read (401 missing, 403 wrong); a body declared
or found to be larger than ``MAX_BODY`` is refused with 413 without reading
the rest.  Only ``repo.content`` events on model repositories are acted on,
for pushes to a branch or to ``refs/pr/N`` with a new sha; everything else is
acknowledged and ignored.  A job carries the push's ``oldSha`` too: the reviewer
answers with what changed since it (``guard.hub.answer``).  Accepted jobs are committed to the queue *before*
the 202 goes out, so a crash after it loses nothing; if the queue cannot be
written the answer is 503 and the Hub delivers again.  ``GET /healthz`` (the
queue answers, the workers are alive) and ``GET /metrics`` (Prometheus text)
are for the platform.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from guard import jsonload
from guard.errors import MissingExtraError
from guard.hub import faults
from guard.hub.metrics import CONTENT_TYPE
from guard.hub.queue import PR_REF, Job, QueueError
from guard.hub.reviewer import Reviewer

log = logging.getLogger("ckpt-guard.webhook")
MAX_BODY = 1024 * 1024  # Hub payloads are a few KB
QUEUE_RETRY_AFTER = "30"  # seconds, on a 503 when the queue cannot be written
SHA = re.compile(r"[0-9a-f]{40}")


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
    updates = payload.get("updatedRefs") or []
    if not isinstance(updates, list):
        raise ValueError("updatedRefs is not a list")
    jobs = []
    for update in updates:
        if not isinstance(update, dict):
            continue
        ref, sha = update.get("ref"), update.get("newSha")
        if not isinstance(ref, str) or not isinstance(sha, str) or not sha:
            continue  # a deleted ref, or a malformed entry
        if ref.startswith("refs/heads/") or PR_REF.match(ref):
            jobs.append(Job(repo["name"], ref, sha, old_sha=previous_head(update.get("oldSha"))))
    if not jobs:
        return None, "no branch or pull-request ref with a new commit"
    return jobs, ""


def previous_head(old: object) -> str | None:
    """The event's ``oldSha`` when it names a commit: null or zeros (a new ref) and garbage are None."""
    if isinstance(old, str) and SHA.fullmatch(old) and old.strip("0"):
        return old
    return None


def create_app(*, secret: str, reviewer: Reviewer) -> Any:
    try:
        from starlette.applications import Starlette
        from starlette.concurrency import run_in_threadpool
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route
    except ImportError:
        raise MissingExtraError("starlette", "hub") from None

    expected = secret.encode("utf-8")
    metrics = reviewer.metrics

    def refuse(reason: str, status: int, message: str, **headers: str) -> JSONResponse:
        metrics.inc("ckpt_guard_deliveries_rejected_total", reason)
        return JSONResponse({"error": message}, status_code=status, headers=headers or None)

    async def webhook(request: Request) -> JSONResponse:
        metrics.inc("ckpt_guard_deliveries_received_total")
        given = request.headers.get("x-webhook-secret")
        # Refusals close the connection: the body of a sender without the secret is never read.
        if given is None:
            return refuse("missing_secret", 401, "missing X-Webhook-Secret", connection="close")
        # Header values arrive decoded as latin-1: encoding back gives the bytes that were sent.
        if not hmac.compare_digest(given.encode("latin-1"), expected):
            return refuse("wrong_secret", 403, "wrong X-Webhook-Secret", connection="close")
        body = await read_capped(request, MAX_BODY)
        if body is None:  # close: the rest of the body is never read
            return refuse("too_large", 413, f"payload over {MAX_BODY} bytes", connection="close")
        try:
            jobs, reason = parse_payload(jsonload.loads(body))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError included
            return refuse("bad_payload", 400, f"bad payload: {str(exc)[:200]}")
        if jobs is None:
            metrics.inc("ckpt_guard_deliveries_ignored_total")
            return JSONResponse({"status": "ignored", "reason": reason})
        faults.reached("before-enqueue")
        try:
            added = await run_in_threadpool(reviewer.submit_all, jobs)
        except QueueError as exc:  # the sender hears only that it should come back
            log.error("delivery refused, the queue cannot be written: %s", exc)
            return refuse("queue_unavailable", 503, "the job queue is unavailable; deliver again later",
                          **{"retry-after": QUEUE_RETRY_AFTER})
        faults.reached("after-enqueue")
        queued = sum(added)
        metrics.inc("ckpt_guard_jobs_enqueued_total", by=queued)
        metrics.inc("ckpt_guard_jobs_duplicate_total", by=len(jobs) - queued)
        return JSONResponse({"status": "accepted", "queued": queued, "duplicates": len(jobs) - queued},
                            status_code=202)

    def health() -> tuple[dict[str, Any], list[str]]:
        problems: list[str] = []
        counts: dict[str, int] = {}
        try:
            counts = reviewer.stats()
        except QueueError as exc:
            problems.append(str(exc))
        alive, wanted = reviewer.workers_alive(), reviewer.settings.workers
        if alive < wanted:
            problems.append(f"{wanted - alive} of {wanted} review workers stopped")
        return {**counts, "workers": {"alive": alive, "configured": wanted}}, problems

    async def healthz(request: Request) -> JSONResponse:
        state, problems = await run_in_threadpool(health)
        return JSONResponse({"status": "unhealthy" if problems else "ok", **state, "problems": problems},
                            status_code=503 if problems else 200)

    async def prometheus(request: Request) -> Response:
        state, _ = await run_in_threadpool(health)
        counts = {k: float(v) for k, v in state.items() if isinstance(v, int)}
        gauges = {"ckpt_guard_jobs": counts, "ckpt_guard_queue_up": {"": float(bool(counts))},
                  "ckpt_guard_workers_alive": {"": float(state["workers"]["alive"])}}
        return Response(metrics.render(gauges), media_type=CONTENT_TYPE)

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        reviewer.start()  # resumes what is due: queued jobs and expired leases
        yield
        await run_in_threadpool(reviewer.close)  # running reviews finish; queued jobs stay queued

    return Starlette(routes=[Route("/webhook", webhook, methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"]),
                             Route("/metrics", prometheus, methods=["GET"])], lifespan=lifespan)


async def read_capped(request: Any, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to exceed ``limit`` (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
