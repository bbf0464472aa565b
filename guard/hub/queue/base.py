"""What the queue holds and promises, whichever database keeps it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from guard.errors import GuardError
from guard.records import Record

PR_REF = re.compile(r"^refs/pr/(\d+)$")
# queued -> running -> answered | skipped | failed; running -> queued on a retry or a release;
# failed -> queued on a redelivery or `hub jobs --requeue-failed`.
STATES = ("queued", "running", "answered", "skipped", "failed")
PENDING = ("queued", "running")
SCHEMA_VERSION = 3  # 2: the Hub endpoint is part of a job's key (rows from 1 keep endpoint ''); 3: old_sha


class QueueError(GuardError):
    """The queue's database cannot be opened or reached (exit 2; the webhook answers 503)."""


class Job(Record):
    repo_id: str
    ref: str  # refs/heads/main or refs/pr/N
    sha: str
    # The Hub it was pushed to (no trailing /): the same (repo, ref, sha) on a staging Hub and in
    # production are two jobs.  '' is a job queued before the endpoint was recorded: any reviewer takes it.
    endpoint: str = ""
    # The ref's head before the push (the event's oldSha): the reviewer answers with the diff against it.
    # None: unknown (a new branch or pull request, or a job queued before it was recorded): the whole
    # snapshot is reviewed.  Not part of the queue's key: a redelivery of the same push is the same job.
    old_sha: str | None = None

    @property
    def pr_num(self) -> int | None:
        match = PR_REF.match(self.ref)
        return int(match.group(1)) if match else None


class QueuedJob(Record):
    id: int
    job: Job
    state: str
    attempts: int  # claims so far, this one included
    enqueued_at: float  # unix seconds
    updated_at: float
    worker: str | None = None  # who holds it, or who finished it
    error: str | None = None  # the last failure

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "endpoint": self.job.endpoint or None, "repo": self.job.repo_id,
                "ref": self.job.ref, "sha": self.job.sha, "old_sha": self.job.old_sha, "state": self.state,
                "attempts": self.attempts,
                "enqueued_at": self.enqueued_at, "updated_at": self.updated_at, "worker": self.worker,
                "error": self.error}


class JobQueue(Protocol):
    """Every method is one transaction; ``worker`` arguments make a stale worker's calls no-ops."""

    where: str  # for messages: the file, or the database without its password

    def enqueue(self, jobs: Sequence[Job]) -> list[bool]:
        """Store jobs; False for one already queued, running or done (a failed one is queued again).

        The key is (endpoint, repo, ref, sha).
        """

    def claim(self, worker: str, *, lease: float, max_attempts: int,
              endpoint: str | None = None) -> QueuedJob | None:
        """The oldest due job (queued, or running with an expired lease), now held by ``worker``.

        With ``endpoint``, only that Hub's jobs and those queued without one (a reviewer never
        answers a staging Hub's push on production, or the other way round).

        ``worker`` names this one claim (a fresh token each time, never shared by two
        threads), so a stale holder's calls are no-ops once someone else claimed the job.
        A job whose lease expired ``max_attempts`` times (its workers keep dying) is failed instead.
        """

    def extend(self, claims: Sequence[tuple[int, str]], *, lease: float) -> set[int]:
        """Renew the leases of these (job id, worker) claims; the ids no longer so held are left out."""

    def finish(self, job_id: int, worker: str, state: str) -> bool:
        """``answered`` or ``skipped``; False if ``worker`` no longer held it."""

    def retry(self, job_id: int, worker: str, *, error: str, delay: float) -> bool:
        """Back to queued, due in ``delay`` seconds."""

    def fail(self, job_id: int, worker: str, *, error: str) -> bool:
        """Give up: ``failed`` until a redelivery or a requeue."""

    def release(self, claims: Sequence[tuple[int, str]]) -> int:
        """Hand back these claims (a clean shutdown): due now, the attempt not counted."""

    def requeue_failed(self) -> int: ...

    def prune(self, older_than: float) -> int:
        """Forget answered, skipped and failed jobs not touched for ``older_than`` seconds."""

    def counts(self) -> dict[str, int]: ...

    def jobs(self, states: Sequence[str] = STATES, *, limit: int = 1000) -> list[QueuedJob]: ...

    def ping(self) -> None:
        """Raise QueueError unless the database answers."""

    def close(self) -> None: ...
