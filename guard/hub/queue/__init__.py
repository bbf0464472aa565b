"""The reviewer's durable job queue: what was accepted stays until it is answered.

``open_queue(state)`` picks the backend from ``--state``: a path opens an
embedded SQLite database (``sqlite``, WAL mode; one host, one or several
processes), a ``postgresql://`` URL a PostgreSQL database shared by replicas
on several hosts (``postgres``, psycopg 3, claims with ``FOR UPDATE SKIP
LOCKED``).  Both keep the same table and obey the ``JobQueue`` protocol of
``base``: a job is keyed by (Hub endpoint, repo, ref, sha), so a push answered
on a staging Hub is still new in production (queues written before the key
held the endpoint are migrated on open; their rows keep working, endpoint '');
jobs are enqueued before the webhook answers 202, claimed with a lease that a
live worker keeps extending, retried with back-off a bounded number of times,
and end ``answered``, ``skipped`` (the Hub already had our answer) or
``failed``.  The answer's marker on the Hub stays the idempotency
key: a job re-run after a crash finds it and does not post again.
"""

from __future__ import annotations

import os
from pathlib import Path

from guard.hub.queue.base import PR_REF, STATES, Job, JobQueue, QueuedJob, QueueError

__all__ = ["BACKENDS", "PR_REF", "STATES", "Job", "JobQueue", "QueueError", "QueuedJob", "default_state", "open_queue"]

# URL scheme -> backend; anything else is a SQLite file path.
BACKENDS = {"postgresql": "postgres", "postgres": "postgres"}


def default_state() -> Path:
    """``$XDG_CACHE_HOME/ckpt-guard/reviewer.sqlite3`` (``~/.cache`` when unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "ckpt-guard" / "reviewer.sqlite3"


def open_queue(state: str | Path | None = None) -> JobQueue:
    text = str(state) if state is not None else ""
    scheme = text.partition("://")[0].lower() if "://" in text else ""
    if BACKENDS.get(scheme) == "postgres":
        from guard.hub.queue.postgres import PostgresQueue

        return PostgresQueue(text)
    if scheme:
        raise QueueError(f"--state {text.partition('://')[0]}://...: not a supported database "
                         "(a file path for SQLite, or postgresql://...)")
    from guard.hub.queue.sqlite import SqliteQueue

    return SqliteQueue(Path(text) if text else default_state())
