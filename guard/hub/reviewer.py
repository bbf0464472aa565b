"""The webhook's background worker: scan a pushed revision, answer once on the Hub.

A push to ``refs/pr/N`` gets a comment on that pull request; a push to a branch
gets one discussion per revision.  Both carry a hidden marker with the commit
sha, and the Hub is asked before posting, so a redelivered event (the Hub
retries, and its Activity tab replays) never produces a second answer, even
after a restart of the service.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from guard.config import Policy
from guard.errors import GuardError
from guard.hub.client import HubClient, hub_errors
from guard.hub.comment import discussion_title, hub_markdown, marker
from guard.hub.scan import scan_hub

log = logging.getLogger("ckpt-guard.webhook")
PR_REF = re.compile(r"^refs/pr/(\d+)$")
MAX_REMEMBERED = 10_000


@dataclass(frozen=True)
class Job:
    repo_id: str
    ref: str  # refs/heads/main or refs/pr/N
    sha: str

    @property
    def pr_num(self) -> int | None:
        match = PR_REF.match(self.ref)
        return int(match.group(1)) if match else None


class Reviewer:
    def __init__(self, client: HubClient, policy: Policy, *, workers: int = 4) -> None:
        self.client = client
        self.policy = policy
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="ckpt-guard-review")
        self._seen: OrderedDict[Job, None] = OrderedDict()  # queued, running or answered
        self._cond = threading.Condition()
        self.pending = 0
        self.answered = 0
        self.skipped = 0  # already answered on the Hub
        self.failed = 0

    def submit(self, job: Job) -> bool:
        """Queue a scan unless the same revision is already queued or answered here."""
        with self._cond:
            if job in self._seen:
                return False
            self._seen[job] = None
            while len(self._seen) > MAX_REMEMBERED:
                self._seen.popitem(last=False)
            self.pending += 1
        self._pool.submit(self._run, job)
        return True

    def wait_idle(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.pending == 0, timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"pending": self.pending, "answered": self.answered, "skipped": self.skipped,
                    "failed": self.failed}

    def _run(self, job: Job) -> None:
        outcome = "failed"
        try:
            outcome = "answered" if self.review(job) else "skipped"
        except GuardError as exc:
            log.error("review of %s@%s failed: %s", job.repo_id, job.sha[:12], exc)
        except Exception:  # noqa: BLE001 - a bug in one review must not stop the service
            log.exception("review of %s@%s crashed", job.repo_id, job.sha[:12])
        with self._cond:
            setattr(self, outcome, getattr(self, outcome) + 1)
            if outcome == "failed":
                self._seen.pop(job, None)  # let a redelivery try again
            self.pending -= 1
            self._cond.notify_all()

    def review(self, job: Job) -> bool:
        """Scan and post; False when the Hub already has our answer for this revision."""
        if self._already_answered(job):
            return False
        result = scan_hub([job.repo_id], self.policy, self.client, revision=job.sha, repo_workers=1)
        if result.errors:
            raise result.errors[0]
        report = result.report
        verdict = "failed" if report.failed else "passed"
        where = f"pull request #{job.pr_num}" if job.pr_num else f"`{job.ref.removeprefix('refs/heads/')}`"
        intro = f"ckpt-guard scanned commit `{job.sha[:12]}` on {where}: the dtype policy **{verdict}**."
        body = hub_markdown(report, intro=intro, sha=job.sha)
        api = self.client.api
        with hub_errors(job.repo_id, endpoint=self.client.endpoint):
            if job.pr_num is not None:
                api.comment_discussion(job.repo_id, job.pr_num, body)
            else:
                api.create_discussion(job.repo_id, title=discussion_title(job.sha, job.ref), description=body)
        log.info("answered %s@%s (%s)", job.repo_id, job.sha[:12], verdict)
        return True

    def _already_answered(self, job: Job) -> bool:
        api = self.client.api
        with hub_errors(job.repo_id, endpoint=self.client.endpoint):
            if job.pr_num is not None:
                details = self.client.call(lambda: api.get_discussion_details(job.repo_id, job.pr_num))
                return any(marker(job.sha) in _content(e) for e in details.events)
            title = discussion_title(job.sha, job.ref)
            return self.client.call(lambda: any(
                d.title == title for d in api.get_repo_discussions(job.repo_id, discussion_type="discussion")))


def _content(event: Any) -> str:
    return str(getattr(event, "content", "") or "")
