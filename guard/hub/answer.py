"""One review: scan a pushed revision remotely and answer once on the Hub.

A push to ``refs/pr/N`` gets a comment on that pull request; a push to a branch
gets one discussion per revision.  Both carry a hidden marker with the commit
sha, and the Hub is asked for it before scanning, so a redelivered event or a
job re-run after a crash (the Hub retries, its Activity tab replays) never
produces a second answer.  The post itself is one request, retried only after
a 429 (or a 503 with Retry-After): an answer that may have been acted on is
not repeated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from guard.config import Policy
from guard.hub import faults
from guard.hub.client import HubClient, hub_errors, retry_refused
from guard.hub.comment import discussion_title, hub_markdown, marker
from guard.hub.queue import Job
from guard.hub.scan import scan_hub


class LeaseLost(Exception):
    """Another worker took the job over (our lease expired): leave the answer to it."""


def answer_push(client: HubClient, policy: Policy, job: Job, *,
                before_post: Callable[[], bool] | None = None) -> bool:
    """Scan and post; False when the Hub already has our answer for this revision.

    ``before_post`` is asked last, just before the post (the reviewer renews its
    lease there); False raises LeaseLost and nothing is posted.
    """
    if already_answered(client, job):
        return False
    result = scan_hub([job.repo_id], policy, client, revision=job.sha, repo_workers=1)
    if result.errors:
        raise result.errors[0]
    faults.reached("mid-scan")
    report = result.report
    verdict = "failed" if report.failed else "passed"
    where = f"pull request #{job.pr_num}" if job.pr_num else f"`{job.ref.removeprefix('refs/heads/')}`"
    intro = f"ckpt-guard scanned commit `{job.sha[:12]}` on {where}: the dtype policy **{verdict}**."
    body = hub_markdown(report, intro=intro, sha=job.sha)
    if before_post is not None and not before_post():
        raise LeaseLost(job)
    api = client.api
    with hub_errors(job.repo_id, endpoint=client.endpoint):
        if job.pr_num is not None:
            client.call(lambda: api.comment_discussion(job.repo_id, job.pr_num, body), retry=retry_refused)
        else:
            # Not HfApi.create_discussion: it reads the discussion back after creating it, and a
            # refused read would make the whole call look failed after the write was made.
            client.post_json(f"{client.endpoint}/api/models/{quote(job.repo_id, safe='/')}/discussions",
                             {"title": discussion_title(job.sha, job.ref), "description": body,
                              "pullRequest": False})
    return True


def already_answered(client: HubClient, job: Job) -> bool:
    api = client.api
    with hub_errors(job.repo_id, endpoint=client.endpoint):
        if job.pr_num is not None:
            details = client.call(lambda: api.get_discussion_details(job.repo_id, job.pr_num))
            return any(marker(job.sha) in _content(e) for e in details.events)
        title = discussion_title(job.sha, job.ref)
        return client.call(lambda: any(
            d.title == title for d in api.get_repo_discussions(job.repo_id, discussion_type="discussion")))


def _content(event: Any) -> str:
    return str(getattr(event, "content", "") or "")
