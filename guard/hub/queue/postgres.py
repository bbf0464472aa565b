"""The shared queue: one PostgreSQL table for replicas on several hosts (psycopg 3).

A claim is one ``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED)``:
replicas claiming at once each lock a different row and never wait on one
another.  Every time is the database server's ``now()``, so leases do not
depend on the replicas' clocks agreeing.  The table is ``ckpt_guard_jobs``;
it is created on first use under an advisory lock (replicas may start at once).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from guard.errors import MissingExtraError
from guard.hub.queue.base import STATES, Job, QueuedJob, QueueError

T = TypeVar("T")
TABLE = "ckpt_guard_jobs"
SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id BIGSERIAL PRIMARY KEY,
        endpoint TEXT NOT NULL DEFAULT '', repo TEXT NOT NULL, ref TEXT NOT NULL, sha TEXT NOT NULL,
        state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(), updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        next_at TIMESTAMPTZ NOT NULL DEFAULT now(), lease_until TIMESTAMPTZ, worker TEXT, error TEXT)""",
    # Schema 1 keyed jobs by (repo, ref, sha): old rows get endpoint '' (any reviewer takes them), and
    # the key gains the endpoint.  Every replica must run this version once the table is migrated.
    f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS endpoint TEXT NOT NULL DEFAULT ''",
    f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {TABLE}_repo_ref_sha_key",
    f"CREATE UNIQUE INDEX IF NOT EXISTS {TABLE}_key ON {TABLE} (endpoint, repo, ref, sha)",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_due ON {TABLE} (state, next_at)",
    # Schema 3: the push's previous head (the event's oldSha); NULL for older rows (the snapshot is reviewed).
    f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS old_sha TEXT",
)
SCHEMA_LOCK = 0x636B7074  # pg_advisory_xact_lock key: "ckpt"
COLUMNS = ("id, endpoint, repo, ref, sha, state, attempts, extract(epoch FROM enqueued_at), "
           "extract(epoch FROM updated_at), worker, error, old_sha")
HELD = "id = %s AND worker = %s AND state = 'running'"


class PostgresQueue:
    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:
            raise MissingExtraError("psycopg", "postgres") from None
        self._psycopg = psycopg
        self.url = url
        # Never print a password, whether in the authority or in the query string.
        self.where = re.sub(r"(password=)[^&]*", r"\1***", re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url))
        self._lock = threading.Lock()
        self._db: Any = None
        self._run(self._create)

    def _create(self, db: Any) -> None:
        db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        for statement in SCHEMA:
            db.execute(statement)

    def _run(self, body: Callable[[Any], T]) -> T:
        """``body(connection)`` in one transaction; one reconnect if the connection was lost."""
        psycopg = self._psycopg
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._db is None or self._db.closed:
                        self._db = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
                    with self._db.transaction():
                        return body(self._db)
                except psycopg.OperationalError as exc:
                    self._close_quietly()
                    if attempt == 2:
                        raise QueueError(f"{self.where}: cannot reach the job queue "
                                         f"({_first_line(exc)})") from None
                except psycopg.Error as exc:
                    raise QueueError(f"{self.where}: job queue error ({_first_line(exc)})") from None
        raise AssertionError("unreachable")

    def _close_quietly(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except self._psycopg.Error:
                pass
            self._db = None

    def enqueue(self, jobs: Sequence[Job]) -> list[bool]:
        def body(db: Any) -> list[bool]:
            out = []
            for job in jobs:
                key = (job.endpoint, job.repo_id, job.ref, job.sha)
                row = db.execute(f"INSERT INTO {TABLE} (endpoint, repo, ref, sha, state, old_sha) "
                                 "VALUES (%s, %s, %s, %s, 'queued', %s) "
                                 "ON CONFLICT (endpoint, repo, ref, sha) DO NOTHING RETURNING id",
                                 (*key, job.old_sha)).fetchone()
                if row is None:  # known: only a failed job comes back
                    row = db.execute(f"UPDATE {TABLE} SET state = 'queued', attempts = 0, next_at = now(), "
                                     "updated_at = now(), error = NULL, worker = NULL WHERE endpoint = %s "
                                     "AND repo = %s AND ref = %s AND sha = %s AND state = 'failed' RETURNING id",
                                     key).fetchone()
                out.append(row is not None)
            return out

        return self._run(body)

    def claim(self, worker: str, *, lease: float, max_attempts: int,
              endpoint: str | None = None) -> QueuedJob | None:
        # None: every job; otherwise that Hub's and the ones queued without an endpoint
        mine, ours = ("TRUE", ()) if endpoint is None else ("endpoint IN (%s, '')", (endpoint,))

        def body(db: Any) -> QueuedJob | None:
            db.execute(f"UPDATE {TABLE} SET state = 'failed', updated_at = now(), lease_until = NULL, "
                       "error = 'its worker stopped ' || attempts || ' times before finishing (lease expired)' "
                       f"WHERE id IN (SELECT id FROM {TABLE} WHERE state = 'running' AND lease_until < now() "
                       f"AND attempts >= %s AND {mine} FOR UPDATE SKIP LOCKED)", (max_attempts, *ours))
            row = db.execute(
                f"UPDATE {TABLE} SET state = 'running', worker = %s, attempts = attempts + 1, updated_at = now(), "
                "lease_until = now() + make_interval(secs => %s) WHERE id = ("
                f"SELECT id FROM {TABLE} WHERE ((state = 'queued' AND next_at <= now()) "
                f"OR (state = 'running' AND lease_until < now())) AND {mine} ORDER BY next_at, id LIMIT 1 "
                f"FOR UPDATE SKIP LOCKED) RETURNING {COLUMNS}", (worker, float(lease), *ours)).fetchone()
            return _job(row) if row else None

        return self._run(body)

    def extend(self, claims: Sequence[tuple[int, str]], *, lease: float) -> set[int]:
        if not claims:
            return set()

        def body(db: Any) -> set[int]:
            held = set()
            for job_id, worker in claims:
                if db.execute(f"UPDATE {TABLE} SET lease_until = now() + make_interval(secs => %s) WHERE {HELD}",
                              (float(lease), job_id, worker)).rowcount:
                    held.add(job_id)
            return held

        return self._run(body)

    def finish(self, job_id: int, worker: str, state: str) -> bool:
        if state not in ("answered", "skipped"):
            raise ValueError(state)
        return self._update(job_id, worker, "state = %s, lease_until = NULL, error = NULL", (state,))

    def retry(self, job_id: int, worker: str, *, error: str, delay: float) -> bool:
        return self._update(job_id, worker, "state = 'queued', lease_until = NULL, error = %s, "
                            "next_at = now() + make_interval(secs => %s)", (error, float(delay)))

    def fail(self, job_id: int, worker: str, *, error: str) -> bool:
        return self._update(job_id, worker, "state = 'failed', lease_until = NULL, error = %s", (error,))

    def _update(self, job_id: int, worker: str, assignments: str, values: tuple[object, ...]) -> bool:
        return self._run(lambda db: db.execute(
            f"UPDATE {TABLE} SET {assignments}, updated_at = now() WHERE {HELD}",
            (*values, job_id, worker)).rowcount > 0)

    def release(self, claims: Sequence[tuple[int, str]]) -> int:
        def body(db: Any) -> int:
            return sum(db.execute(f"UPDATE {TABLE} SET state = 'queued', lease_until = NULL, worker = NULL, "
                                  "next_at = now(), updated_at = now(), attempts = GREATEST(attempts - 1, 0) "
                                  f"WHERE {HELD}", (job_id, worker)).rowcount for job_id, worker in claims)

        return int(self._run(body))

    def requeue_failed(self) -> int:
        return int(self._run(lambda db: db.execute(
            f"UPDATE {TABLE} SET state = 'queued', attempts = 0, next_at = now(), updated_at = now() "
            "WHERE state = 'failed'").rowcount))

    def prune(self, older_than: float) -> int:
        return int(self._run(lambda db: db.execute(
            f"DELETE FROM {TABLE} WHERE state IN ('answered', 'skipped', 'failed') "
            "AND updated_at < now() - make_interval(secs => %s)", (float(older_than),)).rowcount))

    def counts(self) -> dict[str, int]:
        found = dict(self._run(lambda db: db.execute(
            f"SELECT state, COUNT(*) FROM {TABLE} GROUP BY state").fetchall()))
        return {state: int(found.get(state, 0)) for state in STATES}

    def jobs(self, states: Sequence[str] = STATES, *, limit: int = 1000) -> list[QueuedJob]:
        rows = self._run(lambda db: db.execute(
            f"SELECT {COLUMNS} FROM {TABLE} WHERE state = ANY(%s) ORDER BY id LIMIT %s",
            (list(states), limit)).fetchall())
        return [_job(row) for row in rows]

    def ping(self) -> None:
        self._run(lambda db: db.execute("SELECT 1").fetchone())

    def close(self) -> None:
        with self._lock:
            self._close_quietly()


def _job(row: Sequence[Any]) -> QueuedJob:
    job_id, endpoint, repo, ref, sha, state, attempts, enqueued, updated, worker, error, old_sha = row
    return QueuedJob(int(job_id), Job(repo, ref, sha, endpoint, old_sha), state, int(attempts), float(enqueued),
                     float(updated), worker, error)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
