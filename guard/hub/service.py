"""`hub webhook` as a process: the queue, the reviewer and the app wired together.

``serve`` runs the app under uvicorn until SIGTERM/SIGINT (then running
reviews finish and the rest stays queued for the next start); ``drain`` is
``--once``: review what is due, then exit, for a cron job beside a receiver
started with ``--workers 0``.  Old finished jobs are pruned at start.
"""

from __future__ import annotations

import logging
from collections import Counter

from guard.config import Policy
from guard.errors import MissingExtraError
from guard.hub import faults, logs
from guard.hub.client import HubClient
from guard.hub.metrics import Metrics
from guard.hub.queue import JobQueue
from guard.hub.reviewer import Reviewer, ReviewSettings

log = logging.getLogger("ckpt-guard.service")
OUTCOMES = ("answered", "skipped", "quiet", "retried", "failed", "lost")
KEEP_FINISHED = 30 * 86400.0  # seconds a finished job is remembered (redeliveries are duplicates meanwhile)


def build_reviewer(client: HubClient, policy: Policy, queue: JobQueue, settings: ReviewSettings) -> Reviewer:
    queue.prune(KEEP_FINISHED)
    return Reviewer(client, policy, queue, settings=settings, metrics=Metrics())


def require_server() -> None:
    """Fail with the install hint before anything is opened or configured."""
    for module in ("starlette", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            raise MissingExtraError(module, "hub") from None


def serve(*, host: str, port: int, secret: str, policy: Policy, client: HubClient, queue: JobQueue,
          settings: ReviewSettings, log_format: str = "text") -> None:
    import uvicorn

    from guard.hub.webhook import create_app

    faults.validate()
    try:
        app = create_app(secret=secret, reviewer=build_reviewer(client, policy, queue, settings))
        config = logs.configure(log_format)
        uvicorn.run(app, host=host, port=port, log_config=config, log_level="info")
    finally:
        queue.close()


def drain(*, policy: Policy, client: HubClient, queue: JobQueue, settings: ReviewSettings,
          log_format: str = "text") -> Counter[str]:
    faults.validate()
    logs.configure(log_format)
    try:
        outcomes = build_reviewer(client, policy, queue, settings).drain()
        left = queue.counts()
    finally:
        queue.close()
    log.info("reviewed %d job(s): %s; %d still queued (retries not due yet)", sum(outcomes.values()),
             ", ".join(f"{outcomes[k]} {k}" for k in OUTCOMES), left["queued"],
             extra={"event": "drained", **{k: outcomes[k] for k in OUTCOMES}, "queued": left["queued"]})
    return outcomes
