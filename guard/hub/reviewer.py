"""The webhook's workers: claim a queued push, scan it, answer once on the Hub.

What one review does is ``guard.hub.answer``: its marker on the Hub, asked for
before posting, is the idempotency key.  Jobs live in a durable queue (``guard.hub.queue``); each worker holds its job
under a lease that a heartbeat thread renews.  A worker that dies (SIGKILL,
OOM, a lost host) stops renewing, the lease expires and another worker (this
replica after a restart, or another one) takes the job again.  If the first
one had already posted, the marker is found and the job ends ``skipped``:
nothing is lost and nothing is answered twice.  With ``fix`` (`hub webhook
--fix`), a failing push to a branch is also offered one fix pull request
(``guard.hub.fix.offer_fix``, idempotent through its own marker), and a push to
a pull request we opened is not reviewed at all.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from guard.config import Policy
from guard.errors import GuardError
from guard.hub import faults
from guard.hub.access import Identity
from guard.hub.answer import LeaseLost, Outcome, answer_push
from guard.hub.client import HubClient
from guard.hub.metrics import Metrics
from guard.hub.queue import PR_REF, Job, JobQueue, QueuedJob, QueueError
from guard.hub.queue.base import PENDING
from guard.hub.retry import Backoff
from guard.records import Record

__all__ = ["PR_REF", "Job", "ReviewSettings", "Reviewer"]
log = logging.getLogger("ckpt-guard.reviewer")
JOB_RETRY_CAP = 3600.0  # seconds: the longest a failed job waits for its next attempt


class ReviewSettings(Record):
    workers: int = 4  # 0: accept deliveries only (a separate `hub webhook --once` reviews them)
    lease: float = 60.0  # seconds a claim lasts without a heartbeat
    max_attempts: int = 5
    retry_backoff: float = 30.0  # seconds before the 2nd attempt of a failed job; doubles after
    poll: float = 1.0  # how often idle workers look for jobs due from elsewhere (retries, other replicas)
    grace: float = 20.0  # on shutdown, seconds running reviews get to finish before they are handed back
    fix: bool = False  # `--fix`: offer a fix pull request for a failing push to a branch (guard.hub.fix)


class Reviewer:
    def __init__(self, client: HubClient, policy: Policy, queue: JobQueue, *,
                 settings: ReviewSettings | None = None, metrics: Metrics | None = None) -> None:
        self.client = client
        self.policy = policy
        self.queue = queue
        self.settings = settings or ReviewSettings()
        self.metrics = metrics or Metrics()
        # a failed job's next attempt: the Hub client's schedule, from retry_backoff, never past an hour
        self._job_backoff = Backoff(base=self.settings.retry_backoff, cap=JOB_RETRY_CAP, jitter=(0.5, 1.0))
        client.observe = lambda status: self.metrics.inc("ckpt_guard_hub_requests_total", status)
        # Who claims: this process, then one number per claim (two threads never share a claim).
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._claims = itertools.count(1)
        self._held: dict[int, QueuedJob] = {}
        self._lock = threading.Lock()  # guards _held
        self._work = threading.Condition()  # idle workers wait here for submit()
        self._submitted = 0  # bumped by submit(): a worker that missed the notify sees it changed
        self._done = threading.Condition()  # wait_idle() waits here for finished jobs
        self._stop = threading.Event()
        self._beat_stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._beat: threading.Thread | None = None
        self._whoami: tuple[Identity, dict[str, Any]] | None = None  # `--fix`: the token's account, asked once

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the workers; they first take what is due: queued jobs and expired leases."""
        self._start_heartbeat()
        for i in range(self.settings.workers):
            thread = threading.Thread(target=self._work_loop, name=f"ckpt-guard-review-{i}", daemon=True)
            thread.start()
            self._workers.append(thread)

    def close(self) -> None:
        """Stop claiming, let running reviews finish within the grace, hand back the rest."""
        self._stop.set()
        with self._work:
            self._work.notify_all()
        deadline = time.monotonic() + self.settings.grace
        for thread in self._workers:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            unfinished = [(item.id, str(item.worker)) for item in self._held.values()]
        try:
            released = self.queue.release(unfinished)
        except QueueError as exc:
            log.error("could not hand back running jobs: %s", exc)
        else:
            if released:
                log.warning("handed back %d unfinished job(s) for another worker", released)
        self._beat_stop.set()
        if self._beat is not None:
            self._beat.join(5)

    def drain(self) -> Counter[str]:
        """Review every job due now with ``workers`` threads, then return (``hub webhook --once``)."""
        outcomes: Counter[str] = Counter()
        errors: list[QueueError] = []
        lock = threading.Lock()

        def loop() -> None:
            try:
                while (item := self._claim()) is not None:
                    outcome = self._process(item)
                    with lock:
                        outcomes[outcome] += 1
            except QueueError as exc:
                errors.append(exc)

        self._start_heartbeat()
        threads = [threading.Thread(target=loop, name=f"ckpt-guard-drain-{i}")
                   for i in range(max(1, self.settings.workers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._beat_stop.set()
        if errors:
            raise errors[0]
        return outcomes

    # ------------------------------------------------------------ intake and status
    def submit(self, job: Job) -> bool:
        return self.submit_all([job])[0]

    def submit_all(self, jobs: list[Job]) -> list[bool]:
        """Enqueue durably (the caller answers 202 after this returns); False for known jobs.

        Each job is keyed by this reviewer's Hub endpoint as well: a push answered on a
        staging Hub is not a duplicate of the same revision in production.
        """
        jobs = [job if job.endpoint else job._replace(endpoint=self.client.endpoint) for job in jobs]
        added = self.queue.enqueue(jobs)
        if any(added):
            with self._work:  # one worker per new job: a claim storm would only queue on the database
                self._submitted += 1
                self._work.notify(sum(added))
        return added

    def stats(self) -> dict[str, int]:
        return self.queue.counts()

    def workers_alive(self) -> int:
        return sum(thread.is_alive() for thread in self._workers)

    def wait_idle(self, timeout: float) -> bool:
        """Until no job is queued or running (tests, and the end of a drain); False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            counts = self.queue.counts()
            if not any(counts[state] for state in PENDING):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self._done:
                self._done.wait(min(left, 0.05))

    # ------------------------------------------------------------ the work
    def _work_loop(self) -> None:
        while not self._stop.is_set():
            seen = self._submitted
            try:
                item = self._claim()
            except QueueError as exc:
                log.error("cannot claim a job: %s", exc)
                item = None
            if item is None:
                with self._work:
                    self._work.wait_for(lambda: self._submitted != seen or self._stop.is_set(),  # noqa: B023
                                        self.settings.poll)  # (B023: wait_for calls it now, in this iteration)
                continue
            self._process(item)

    def _claim(self) -> QueuedJob | None:
        token = f"{self.worker_id}/{next(self._claims)}"
        item = self.queue.claim(token, lease=self.settings.lease, max_attempts=self.settings.max_attempts,
                                endpoint=self.client.endpoint)
        if item is not None:
            with self._lock:
                self._held[item.id] = item
        return item

    def _process(self, item: QueuedJob) -> str:
        job, started = item.job, time.monotonic()
        fields: dict[str, Any] = {"job": item.id, "repo": job.repo_id, "ref": job.ref, "sha": job.sha,
                                  "attempt": item.attempts}
        try:
            outcome: str = self.review(job, before_post=lambda: self._still_held(item))
        except LeaseLost:
            outcome = "lost"
            log.warning("lease of job %d lost: another worker answers it", item.id, extra=fields)
        except GuardError as exc:
            outcome = self._attempt_failed(item, str(exc), retryable=getattr(exc, "retryable", True), fields=fields)
        except Exception as exc:  # noqa: BLE001 - a bug in one review must not stop the service; logged in full
            log.exception("review of job %d crashed", item.id, extra=fields)
            outcome = self._attempt_failed(item, f"internal error: {type(exc).__name__}: {exc}"[:500],
                                           retryable=True, fields=fields)
        else:
            faults.reached("after-answer")
            seconds = time.monotonic() - started
            try:
                # a quiet push (no checkpoint file changed) is done without an answer: skipped in the queue
                self.queue.finish(item.id, str(item.worker), "answered" if outcome == "answered" else "skipped")
            except QueueError as exc:  # the lease runs out; a re-run finds the marker and skips
                log.error("job %d %s but not marked done: %s", item.id, outcome, exc, extra=fields)
            self.metrics.observe_scan(seconds)
            if outcome == "quiet":
                self.metrics.inc("ckpt_guard_pushes_quiet_total")
            log.info("job %d %s", item.id, outcome, extra={
                **fields, "outcome": outcome, "scan_seconds": round(seconds, 4),
                "latency_seconds": round(time.time() - item.enqueued_at, 4)})
        finally:
            with self._lock:  # only this claim's entry: after a lapsed lease another thread may hold the job
                if self._held.get(item.id) is item:
                    del self._held[item.id]
            with self._done:
                self._done.notify_all()
        self.metrics.inc("ckpt_guard_jobs_finished_total", outcome)
        return outcome

    def _attempt_failed(self, item: QueuedJob, error: str, *, retryable: bool, fields: dict[str, Any]) -> str:
        try:
            if retryable and item.attempts < self.settings.max_attempts:
                delay = self._job_backoff.wait(item.attempts)
                self.queue.retry(item.id, str(item.worker), error=error, delay=delay)
                log.warning("job %d failed (%s); retry in %.1f s", item.id, error, delay,
                            extra={**fields, "error": error, "retry_in": round(delay, 3)})
                return "retried"
            self.queue.fail(item.id, str(item.worker), error=error)
        except QueueError as exc:
            log.error("job %d failed (%s) and the queue could not record it: %s", item.id, error, exc, extra=fields)
        log.error("job %d failed for good after %d attempt(s): %s", item.id, item.attempts, error,
                  extra={**fields, "error": error})
        return "failed"

    def _still_held(self, item: QueuedJob) -> bool:
        return item.id in self.queue.extend([(item.id, str(item.worker))], lease=self.settings.lease)

    def _start_heartbeat(self) -> None:
        self._beat_stop.clear()
        self._beat = threading.Thread(target=self._heartbeat_loop, name="ckpt-guard-heartbeat", daemon=True)
        self._beat.start()

    def _heartbeat_loop(self) -> None:
        while not self._beat_stop.wait(self.settings.lease / 3):
            with self._lock:
                claims = [(item.id, str(item.worker)) for item in self._held.values()]
            try:
                kept = self.queue.extend(claims, lease=self.settings.lease)
            except QueueError as exc:
                log.error("cannot renew leases: %s", exc)
                continue
            for lost in {job_id for job_id, _ in claims} - kept:
                log.warning("lease of job %d expired before its review ended", lost)

    def review(self, job: Job, *, before_post: Callable[[], bool] | None = None) -> Outcome:
        """Review and post: "answered"; "skipped" when the Hub already has our answer for this
        revision; "quiet" for a push that changed no checkpoint file (nothing posted).

        With ``fix``: a push to a pull request we opened (or whose commit is a fix of ours) is
        not reviewed at all, and a failing push to a branch is offered one fix pull request.
        """
        if not self.settings.fix:
            return answer_push(self.client, self.policy, job, before_post=before_post)
        from guard.fix.context import FixOptions
        from guard.hub.access import refusal_of
        from guard.hub.fix import offer_fix, own_pull_request

        identity, answer = self._identity()
        if own_pull_request(self.client, job, identity):
            log.info("push to our own pull request %s of %s: not reviewed", job.ref, job.repo_id,
                     extra={"repo": job.repo_id, "ref": job.ref, "sha": job.sha, "fix": "own-pull-request"})
            return "skipped"
        answered = answer_push(self.client, self.policy, job, before_post=before_post)
        refusal = refusal_of(answer, job.repo_id)
        status = f"no access ({refusal})" if refusal else offer_fix(
            self.client, self.policy, FixOptions(), job, identity=identity, before_post=before_post)
        log.info("fix for %s@%s: %s", job.repo_id, job.sha[:12], status,
                 extra={"repo": job.repo_id, "ref": job.ref, "sha": job.sha, "fix": status})
        return "answered" if status == "opened" else answered

    def _identity(self) -> tuple[Identity, dict[str, Any]]:
        with self._lock:
            known = self._whoami
        if known is None:
            from guard.hub.access import whoami

            known = whoami(self.client)
            with self._lock:
                self._whoami = known
        return known
