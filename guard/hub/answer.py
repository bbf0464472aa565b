"""One review: read a pushed revision remotely and answer once on the Hub, or stay quiet.

A push whose event names its previous head (``oldSha``) is reviewed as a change:
the two listings say which files it touched (``guard.hub.changes``), and a push
that touched no weight file, index or config.json gets no post at all (counted
as ``quiet``).  Otherwise both revisions are read from their headers and the
answer is the diff (``guard.hub.diff``): tensors added, removed, recast and
reshaped, the findings the push introduced and resolved.  A push with no
previous head (a new branch, a new pull request) is reviewed as a snapshot.

A push to ``refs/pr/N`` gets a comment on that pull request.  Pushes to a branch
share one discussion per branch: the first answered push opens it, later ones
comment in it.  Every answer carries a hidden marker with the commit sha, and
the Hub is asked for it before anything is read, so a redelivered event or a
job re-run after a crash (the Hub retries, its Activity tab replays) never
produces a second answer.  The post itself is one request, retried only after a
429 (or a 503 with Retry-After): an answer that may have been acted on is not
repeated.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import quote

from guard.config import Policy
from guard.hub import faults
from guard.hub.client import HubClient, hub_errors, retry_refused
from guard.hub.comment import branch_thread_title, diff_markdown, discussion_title, hub_markdown, marker
from guard.hub.errors import HubError
from guard.hub.queue import Job
from guard.hub.scan import scan_hub

Outcome = Literal["answered", "skipped", "quiet"]
# One review of a ref at a time: locks striped by (endpoint, repo, ref), a bounded set however many
# repositories a long-lived service sees (two refs sharing a stripe only wait for each other).
_STRIPES = tuple(threading.Lock() for _ in range(64))


class LeaseLost(Exception):
    """Another worker took the job over (our lease expired): leave the answer to it."""


def answer_push(client: HubClient, policy: Policy, job: Job, *,
                before_post: Callable[[], bool] | None = None) -> Outcome:
    """Review ``job`` and post; "skipped" when the Hub already has our answer, "quiet" for a push
    that changed no checkpoint file.

    ``before_post`` is asked last, just before the post (the reviewer renews its
    lease there); False raises LeaseLost and nothing is posted.
    """
    # One review of a branch at a time in this process: two pushes reviewed at once would
    # both find no thread and open two.
    with _thread_lock(client, job):
        thread = None
        if job.pr_num is not None:
            if _answered_in(client, job, job.pr_num):
                return "skipped"
        else:
            threads, legacy = _branch_threads(client, job)
            if legacy or any(_answered_in(client, job, num) for num, _ in threads):
                return "skipped"
            thread = next((num for num, status in threads if status == "open"), None)
        body = _review_body(client, policy, job)
        if body is None:
            return "quiet"
        if before_post is not None and not before_post():
            raise LeaseLost(job)
        api = client.api
        with hub_errors(job.repo_id, endpoint=client.endpoint):
            num = job.pr_num if job.pr_num is not None else thread
            if num is not None:
                client.call(lambda: api.comment_discussion(job.repo_id, num, body), retry=retry_refused)
            else:
                # Not HfApi.create_discussion: it reads the discussion back after creating it, and a
                # refused read would make the whole call look failed after the write was made.
                client.post_json(f"{client.endpoint}/api/models/{quote(job.repo_id, safe='/')}/discussions",
                                 {"title": branch_thread_title(job.ref), "description": body,
                                  "pullRequest": False})
    return "answered"


def _review_body(client: HubClient, policy: Policy, job: Job) -> str | None:
    where = f"pull request #{job.pr_num}" if job.pr_num else f"`{job.ref.removeprefix('refs/heads/')}`"
    note = ""
    if job.old_sha:
        from guard.hub.changes import push_changes

        try:
            touched = push_changes(client, job.repo_id, job.old_sha, job.sha).checkpoint_paths
        except HubError:
            if not _old_side_gone(client, job):
                raise
            touched, note = None, (f"The previous head `{job.old_sha[:12]}` cannot be read any more "
                                   "(a force-push?): the whole revision is reviewed.\n\n")
        if touched == ():
            return None
        if touched is not None:
            return _diff_body(client, policy, job, where)
    result = scan_hub([job.repo_id], policy, client, revision=job.sha, repo_workers=1, publishing=True)
    if result.errors:
        raise result.errors[0]
    faults.reached("mid-scan")
    report = result.report
    verdict = "failed" if report.failed else "passed"
    intro = f"{note}ckpt-guard scanned commit `{job.sha[:12]}` on {where}: the dtype policy **{verdict}**."
    return hub_markdown(report, intro=intro, sha=job.sha)


def _diff_body(client: HubClient, policy: Policy, job: Job, where: str) -> str:
    from guard.hub.diff import hub_change

    assert job.old_sha is not None
    change = hub_change(client, job.repo_id, job.old_sha, job.sha, policy, publishing=True).change  # CG120/CG121
    faults.reached("mid-scan")
    introduced, resolved = len(change.introduced), len(change.resolved)
    fail_on = change.policy.get("fail_on")
    verdict = (f"it introduces {introduced} finding(s), the policy (fail-on `{fail_on}`) **failed**" if change.failed
               else f"it introduces no finding at or above `{fail_on}`: **passed**")
    intro = (f"ckpt-guard reviewed commit `{job.sha[:12]}` on {where}, the change since `{job.old_sha[:12]}`: "
             f"{verdict}; it resolves {resolved}.")
    return diff_markdown(change, intro=intro, sha=job.sha, base=job.old_sha)


def _old_side_gone(client: HubClient, job: Job) -> bool:
    from huggingface_hub import errors

    try:
        client.call(lambda: client.api.model_info(job.repo_id, revision=job.old_sha, timeout=client.timeout))
    except errors.RevisionNotFoundError:  # it existed before the push: gone, not late
        return True
    except Exception:  # noqa: BLE001 - anything else: the original error stands
        return False
    return False


def _answered_in(client: HubClient, job: Job, num: int) -> bool:
    api = client.api
    with hub_errors(job.repo_id, endpoint=client.endpoint):
        details = client.call(lambda: api.get_discussion_details(job.repo_id, num))
    return any(marker(job.sha) in _content(e) for e in details.events)


def _branch_threads(client: HubClient, job: Job) -> tuple[list[tuple[int, str]], bool]:
    """The branch's review discussions as (num, status), open ones first, oldest first; and whether a
    per-revision discussion of an earlier reviewer already answered this commit.

    Answers go to the oldest open thread (two replicas that raced to open one converge on it); a
    thread a maintainer closed is never written to again, the next answered push opens a new one.
    """
    api = client.api
    title, legacy = branch_thread_title(job.ref), discussion_title(job.sha, job.ref)
    with hub_errors(job.repo_id, endpoint=client.endpoint):
        listed = client.call(lambda: list(api.get_repo_discussions(job.repo_id, discussion_type="discussion")))
    mine = sorted((d for d in listed if d.title == title), key=lambda d: (d.status != "open", d.num))
    return [(d.num, str(d.status)) for d in mine], any(d.title == legacy for d in listed)


def _thread_lock(client: HubClient, job: Job) -> threading.Lock:
    return _STRIPES[hash((client.endpoint, job.repo_id, job.ref)) % len(_STRIPES)]


def _content(event: Any) -> str:
    return str(getattr(event, "content", "") or "")
