"""The embedded queue: one SQLite file in WAL mode, shared by the processes of one host.

Every change is one ``BEGIN IMMEDIATE`` transaction, so two processes never
claim the same job; ``synchronous=FULL`` makes an enqueue durable (fsynced)
before the webhook answers 202.  Times are this host's clock (one host by
construction: SQLite over a network file system is not supported).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from guard.hub.queue.base import SCHEMA_VERSION, STATES, Job, QueuedJob, QueueError

TABLE = """CREATE TABLE IF NOT EXISTS {name} (
        id INTEGER PRIMARY KEY,
        endpoint TEXT NOT NULL DEFAULT '', repo TEXT NOT NULL, ref TEXT NOT NULL, sha TEXT NOT NULL,
        state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        enqueued_at REAL NOT NULL, updated_at REAL NOT NULL, next_at REAL NOT NULL,
        lease_until REAL, worker TEXT, error TEXT, old_sha TEXT,
        UNIQUE (endpoint, repo, ref, sha))"""
SCHEMA = (TABLE.format(name="jobs"), "CREATE INDEX IF NOT EXISTS jobs_due ON jobs (state, next_at)")
# Schema 1 keyed jobs by (repo, ref, sha).  SQLite cannot change a table's UNIQUE constraint, so the
# table is rebuilt, in the same transaction that reads the version: old rows keep their ids and states
# and get endpoint '' (queued before the endpoint was recorded; any reviewer takes them).
OLD_COLUMNS = "id, repo, ref, sha, state, attempts, enqueued_at, updated_at, next_at, lease_until, worker, error"
MIGRATE_1_TO_2 = (
    TABLE.format(name="jobs_v2"),
    f"INSERT INTO jobs_v2 ({OLD_COLUMNS}) SELECT {OLD_COLUMNS} FROM jobs",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_v2 RENAME TO jobs",
)
# Schema 2 had no old_sha (the push's previous head): a column added with NULL, as a job of unknown base.
MIGRATE_2_TO_3 = ("ALTER TABLE jobs ADD COLUMN old_sha TEXT",)
COLUMNS = "id, endpoint, repo, ref, sha, state, attempts, enqueued_at, updated_at, worker, error, old_sha"
BUSY_TIMEOUT_MS = 30_000


class SqliteQueue:
    def __init__(self, path: Path) -> None:
        self.where = str(path)
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                       timeout=BUSY_TIMEOUT_MS / 1000)
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = FULL")
            with self._tx() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise QueueError(f"{path}: written by a newer ckpt-guard (queue schema {version})")
                columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)").fetchall()}
                if columns and "endpoint" not in columns:  # a schema-1 queue
                    for statement in MIGRATE_1_TO_2:
                        db.execute(statement)
                    columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)").fetchall()}
                if columns and "old_sha" not in columns:  # a schema-2 queue
                    for statement in MIGRATE_2_TO_3:
                        db.execute(statement)
                for statement in SCHEMA:  # not executescript: it would commit the open transaction
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except (OSError, sqlite3.Error) as exc:
            raise QueueError(f"{path}: cannot open the job queue ({exc})") from None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise QueueError(f"{self.where}: job queue error ({exc})") from None

    def enqueue(self, jobs: Sequence[Job]) -> list[bool]:
        now = time.time()
        out = []
        with self._tx() as db:
            for job in jobs:
                key = (job.endpoint, job.repo_id, job.ref, job.sha)
                inserted = db.execute(
                    "INSERT OR IGNORE INTO jobs (endpoint, repo, ref, sha, state, enqueued_at, updated_at, next_at, "
                    "old_sha) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?)", (*key, now, now, now, job.old_sha)).rowcount
                if not inserted:  # known: only a failed job comes back
                    inserted = db.execute(
                        "UPDATE jobs SET state = 'queued', attempts = 0, next_at = ?, updated_at = ?, error = NULL, "
                        "worker = NULL WHERE endpoint = ? AND repo = ? AND ref = ? AND sha = ? AND state = 'failed'",
                        (now, now, *key)).rowcount
                out.append(bool(inserted))
        return out

    def claim(self, worker: str, *, lease: float, max_attempts: int,
              endpoint: str | None = None) -> QueuedJob | None:
        now = time.time()
        # None: every job; otherwise that Hub's and the ones queued without an endpoint
        mine, ours = ("1", ()) if endpoint is None else ("endpoint IN (?, '')", (endpoint,))
        with self._tx() as db:
            db.execute("UPDATE jobs SET state = 'failed', updated_at = ?, lease_until = NULL, "
                       "error = 'its worker stopped ' || attempts || ' times before finishing (lease expired)' "
                       f"WHERE state = 'running' AND lease_until < ? AND attempts >= ? AND {mine}",
                       (now, now, max_attempts, *ours))
            row = db.execute(f"SELECT id FROM jobs WHERE ((state = 'queued' AND next_at <= ?) "
                             f"OR (state = 'running' AND lease_until < ?)) AND {mine} ORDER BY next_at, id LIMIT 1",
                             (now, now, *ours)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE jobs SET state = 'running', worker = ?, lease_until = ?, attempts = attempts + 1, "
                       "updated_at = ? WHERE id = ?", (worker, now + lease, now, row[0]))
            return _job(db.execute(f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (row[0],)).fetchone())

    def extend(self, claims: Sequence[tuple[int, str]], *, lease: float) -> set[int]:
        held: set[int] = set()
        if not claims:
            return held
        now = time.time()
        with self._tx() as db:
            for job_id, worker in claims:
                if db.execute("UPDATE jobs SET lease_until = ? WHERE id = ? AND worker = ? AND state = 'running'",
                              (now + lease, job_id, worker)).rowcount:
                    held.add(job_id)
        return held

    def finish(self, job_id: int, worker: str, state: str) -> bool:
        if state not in ("answered", "skipped"):
            raise ValueError(state)
        return self._update(job_id, worker, "state = ?, lease_until = NULL, error = NULL", (state,))

    def retry(self, job_id: int, worker: str, *, error: str, delay: float) -> bool:
        return self._update(job_id, worker, "state = 'queued', lease_until = NULL, next_at = ?, error = ?",
                            (time.time() + delay, error))

    def fail(self, job_id: int, worker: str, *, error: str) -> bool:
        return self._update(job_id, worker, "state = 'failed', lease_until = NULL, error = ?", (error,))

    def _update(self, job_id: int, worker: str, assignments: str, values: tuple[object, ...]) -> bool:
        with self._tx() as db:
            return bool(db.execute(f"UPDATE jobs SET {assignments}, updated_at = ? "
                                   "WHERE id = ? AND worker = ? AND state = 'running'",
                                   (*values, time.time(), job_id, worker)).rowcount)

    def release(self, claims: Sequence[tuple[int, str]]) -> int:
        now = time.time()
        released = 0
        with self._tx() as db:
            for job_id, worker in claims:
                released += db.execute(
                    "UPDATE jobs SET state = 'queued', lease_until = NULL, worker = NULL, next_at = ?, updated_at = ?, "
                    "attempts = MAX(attempts - 1, 0) WHERE id = ? AND worker = ? AND state = 'running'",
                    (now, now, job_id, worker)).rowcount
        return released

    def requeue_failed(self) -> int:
        now = time.time()
        with self._tx() as db:
            return db.execute("UPDATE jobs SET state = 'queued', attempts = 0, next_at = ?, updated_at = ? "
                              "WHERE state = 'failed'", (now, now)).rowcount

    def prune(self, older_than: float) -> int:
        with self._tx() as db:
            return db.execute("DELETE FROM jobs WHERE state IN ('answered', 'skipped', 'failed') "
                              "AND updated_at < ?", (time.time() - older_than,)).rowcount

    def counts(self) -> dict[str, int]:
        with self._tx() as db:
            found = dict(db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
        return {state: int(found.get(state, 0)) for state in STATES}

    def jobs(self, states: Sequence[str] = STATES, *, limit: int = 1000) -> list[QueuedJob]:
        marks = ", ".join("?" for _ in states)
        with self._tx() as db:
            rows = db.execute(f"SELECT {COLUMNS} FROM jobs WHERE state IN ({marks}) ORDER BY id LIMIT ?",
                              (*states, limit)).fetchall()
        return [_job(row) for row in rows]

    def ping(self) -> None:
        with self._tx() as db:
            db.execute("SELECT 1 FROM jobs LIMIT 1").fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _job(row: tuple) -> QueuedJob:
    job_id, endpoint, repo, ref, sha, state, attempts, enqueued, updated, worker, error, old_sha = row
    return QueuedJob(int(job_id), Job(repo, ref, sha, endpoint, old_sha), state, int(attempts), float(enqueued),
                     float(updated), worker, error)
