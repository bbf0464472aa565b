"""`ckpt-guard hub fix`: plan from the remote headers, fix a partial mirror, open one pull request.

1. With ``create_pr``, the token's right to open a pull request is checked first
   (``guard.hub.access``): a read-only token fails in one line before any file is read.
2. The revision is scanned through ranged reads (``guard.hub.scan``); the findings carry
   their fixes, and ``guard.fix.plan`` plans them as for a local directory.  Without
   ``create_pr`` this is the whole run: a dry run, nothing downloaded.
3. An open pull request of ours carrying the plan's marker means the work is done
   (``guard.hub.proposal``).  Otherwise only the files the fixes read are downloaded into
   ``mirror/<repo_id>/`` and ``guard.fix.apply`` applies the plan there, verified, as locally.
4. Files identical to the revision's are dropped (the fix was merged already); the rest are
   scanned in place of the revision's own (``guard.hub.mirror.OverlayClient``) for the
   "after" report, and go into ONE pull request whose description is the before/after
   report with the table of fixes (``guard.hub.fix_text``).
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guard.config import Policy
from guard.errors import UsageError
from guard.hub.access import Identity, require_pull_request_access
from guard.hub.answer import LeaseLost
from guard.hub.client import HubClient, hub_errors
from guard.hub.fix_result import HubFix
from guard.hub.fix_text import pr_description
from guard.hub.mirror import dir_in_repo, download, join, overlay_client, repo_relative, same_as_listed
from guard.hub.proposal import (
    Proposal,
    find_proposals,
    fix_marker,
    fix_title,
    head_commit,
    is_fix_commit,
    open_once,
)
from guard.hub.queue import PR_REF, Job
from guard.hub.scan import scan_hub
from guard.reporters.inert import inert_text

if TYPE_CHECKING:
    from guard.fix.context import FixOptions
    from guard.fix.plan import FixPlan, PlannedFix
    from guard.report import Report

__all__ = ["HubFix", "fix_repo", "offer_fix", "own_pull_request", "plan_hash", "target_branch"]
SHA = re.compile(r"^[0-9a-f]{40}$")
CONFIG = "config.json"  # read beside every fix: actions consult it (tied weights, declared dtypes)


def target_branch(revision: str | None) -> str:
    """The branch a fix pull request merges into: ``--revision``'s branch, main for a commit sha."""
    if revision is None or SHA.match(revision):
        return "main"
    if PR_REF.match(revision):
        raise UsageError(f"--revision {revision}: a fix pull request merges into a branch, not into another "
                         "pull request")
    return revision.removeprefix("refs/heads/")


def plan_hash(fixes: Sequence[PlannedFix]) -> str:
    """The identity of what a pull request would change: each fix's action, arguments and files."""
    canonical = [[p.fix.action, p.fix.arguments, sorted(p.fix.writes)] for p in fixes]
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def scan_revision(client: HubClient, repo_id: str, policy: Policy, revision: str | None, *,
                  add: Sequence[str] = ()) -> tuple[Report, str]:
    result = scan_hub([repo_id], policy, client, revision=revision, repo_workers=1, add=add)
    if result.errors:
        raise result.errors[0]
    return result.report, str(result.repos[0].sha)


def fix_repo(client: HubClient, repo_id: str, policy: Policy, options: FixOptions, *,
             revision: str | None = None, select: Sequence[str] = (), ignore: Sequence[str] = (),
             create_pr: bool = False, identity: Identity | None = None, once_per_revision: bool = False,
             before_post: Callable[[], bool] | None = None, branch: str | None = None) -> HubFix:
    """Plan (and with ``create_pr`` propose) the fixes of ``repo_id`` at ``revision``.

    ``once_per_revision`` (the reviewer): a fix pull request of ours planned from this very
    commit, in any state (closed included), means nothing is offered again.  ``before_post``
    is asked just before the pull request is opened; False raises LeaseLost.  ``branch``: the
    branch the pull request merges into (default: ``revision``'s, main for a commit sha).
    """
    from guard.fix.plan import plan_fixes

    branch = target_branch(branch or revision)
    if create_pr and identity is None:
        identity = require_pull_request_access(client, repo_id)  # before any file is read
    before, sha = scan_revision(client, repo_id, policy, revision, add=options.add)
    plan = plan_fixes(before, options, select=tuple(select), ignore=tuple(ignore))
    result = HubFix(repo_id, sha, before, plan)
    ready = [p for p in plan.fixes if p.enabled]
    result.plan_hash = plan_hash(ready) if ready else ""
    if not create_pr:
        return result
    assert identity is not None
    if not ready:
        result.status, result.message = "nothing-to-fix", _nothing(plan)
        return result
    found = _proposed(client, repo_id, identity, result.plan_hash, sha, once_per_revision)
    if found is not None:
        return _already(client, policy, result, found)
    with tempfile.TemporaryDirectory(prefix="ckpt-guard-hub-fix-") as work:
        _apply_in_mirror(client, policy, options, result, Path(work) / "mirror")
        if result.status != "opened":
            return result
        marker = fix_marker(result.plan_hash, sha)
        if before_post is not None and not before_post():
            raise LeaseLost(repo_id)
        result.proposal = _open(client, result, identity, branch=branch, marker=marker)
    result.message = (f"ckpt-guard: opened pull request {result.proposal.url} on {repo_id} with "
                      f"{len(result.files)} file(s): {_names(result.files)}")
    return result


def _proposed(client: HubClient, repo_id: str, identity: Identity, plan: str, sha: str,
              once_per_revision: bool) -> Proposal | None:
    if once_per_revision:
        offered = find_proposals(client, repo_id, identity.name, base=sha)
        if offered:
            return offered[0]
    return next((p for p in find_proposals(client, repo_id, identity.name, plan=plan) if p.is_open), None)


def _already(client: HubClient, policy: Policy, result: HubFix, found: Proposal) -> HubFix:
    result.proposal = found
    if found.is_open:
        result.status = "already-open"
        result.after, _ = scan_revision(client, result.repo_id, policy, f"refs/pr/{found.num}")
        result.message = f"ckpt-guard: pull request {found.url} already proposes these fixes; nothing opened"
    else:
        result.status = "already-offered"
        result.message = (f"ckpt-guard: a fix for {result.sha[:12]} was offered before ({found.url}, "
                          f"{found.status}); nothing opened")
    return result


def _apply_in_mirror(client: HubClient, policy: Policy, options: FixOptions, result: HubFix, mirror: Path) -> None:
    """Download what the ready fixes read, apply them, keep the verified files that differ from the revision."""
    from guard.fix.apply import apply_plan

    repo_id, sha = result.repo_id, result.sha
    with hub_errors(repo_id, revision=sha, endpoint=client.endpoint):
        info = client.call(lambda: client.api.model_info(repo_id, revision=sha, files_metadata=True,
                                                         timeout=client.timeout))
    listed = {s.rfilename: s for s in (info.siblings or [])}
    plan, reads = _mirrorable(result.plan, repo_id, listed, options)
    download(client, repo_id, sha, sorted(reads), mirror, listed)
    for planned in plan.fixes:  # a fix's own folder exists in the mirror even when it reads nothing there
        if planned.enabled:  # (its dir was checked to be a folder of the repository)
            (mirror / str(planned.fix.arguments["dir"])).mkdir(parents=True, exist_ok=True)
    result.plan = plan
    # git keeps the replaced file: no NAME.orig in a pull request
    result.outcomes = apply_plan(plan, options._replace(write=True, backup=False), policy, root=mirror)
    written = _written(result.outcomes, mirror, repo_id)
    if not written:
        errors = "; ".join(o.error or o.summary for o in result.outcomes
                           if o.planned.enabled and not o.ok) or "nothing was written"
        result.status = "not-applied"
        result.message = f"ckpt-guard: no fix could be applied to {repo_id}: {inert_text(errors, limit=600)}"
        return
    result.files = {name: path for name, path in written.items() if not same_as_listed(path, listed.get(name))}
    if not result.files:
        result.status = "up-to-date"
        result.message = (f"ckpt-guard: {repo_id}@{sha[:12]} already holds what the fixes write "
                          f"({_names(written)}); nothing opened")
        return
    result.after, _ = scan_revision(overlay_client(client, result.files), repo_id, policy, sha)
    result.status = "opened"


def _mirrorable(plan: FixPlan, repo_id: str, listed: dict[str, Any], options: FixOptions) -> tuple[FixPlan, set[str]]:
    """The plan with the fixes a partial mirror cannot apply held back, and the files to download.

    Held back: a fix whose folder or reads are not repository paths, and one that would write
    over a file of the revision it does not read (the mirror would not show it that file)
    unless --replace was given.
    """
    fixes, reads = [], set()
    for planned in plan.fixes:
        if not planned.enabled:
            fixes.append(planned)
            continue
        args = planned.fix.arguments
        folder = dir_in_repo(repo_id, str(args.get("dir", "")))
        names = args.get("reads") or []
        if isinstance(names, list) and isinstance(args.get("file"), str):
            names = [*names, args["file"]]  # config-dtype names its one file so
        if folder is None or not isinstance(names, list) or any(
                not isinstance(n, str) or repo_relative(n) is None for n in names):
            fixes.append(planned._replace(enabled=False, waiting_for="a fix inside the repository"))
            continue
        needed = {join(folder, n) for n in names if join(folder, n) in listed}
        writes = {w[len(repo_id) + 1:] for w in planned.fix.writes if w.startswith(repo_id + "/")}
        if not options.replace and any(w in listed and w not in needed for w in writes):
            fixes.append(planned._replace(enabled=False, waiting_for="--replace"))
            continue
        reads |= needed | ({join(folder, CONFIG)} & set(listed))
        fixes.append(planned)
    return plan._replace(fixes=fixes), reads


def _written(outcomes: Sequence[Any], mirror: Path, repo_id: str) -> dict[str, Path]:
    """Repository path -> file, for every file a successful fix published inside the repository."""
    root = (mirror / repo_id).resolve()
    out: dict[str, Path] = {}
    for outcome in outcomes:
        if not outcome.ok:
            continue
        for name in outcome.written:
            path = Path(name) if Path(name).is_absolute() else mirror / name
            if not path.resolve().is_relative_to(root):
                continue
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for file in files:  # a fix may add a directory (an Orbax checkpoint): its files
                name = file.resolve().relative_to(root).as_posix()
                if file.is_file() and not name.endswith(".orig"):
                    out[name] = file
    return out


def _open(client: HubClient, result: HubFix, identity: Identity, *, branch: str, marker: str) -> Proposal:
    from huggingface_hub import CommitOperationAdd

    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
                  for name, path in sorted(result.files.items())]
    ready = sum(p.enabled for p in result.plan.fixes)
    return open_once(
        client, result.repo_id, operations, title=fix_title(result.plan_hash, result.sha, ready),
        description=pr_description(result, marker=marker), branch=branch, parent=result.sha,
        plan=result.plan_hash,
        existing=lambda: next((p for p in find_proposals(client, result.repo_id, identity.name,
                                                         plan=result.plan_hash) if p.is_open), None))


def _names(files: dict[str, Path]) -> str:
    return ", ".join(inert_text(name) for name in sorted(files))  # repository paths: shown, never obeyed


def _nothing(plan: FixPlan) -> str:
    waiting = sorted({p.waiting_for or p.fix.flag or "?" for p in plan.fixes if not p.enabled})
    if waiting:
        return f"ckpt-guard: nothing opened: every planned fix waits for a flag ({inert_text(', '.join(waiting))})"
    return "ckpt-guard: nothing to fix"


# ---------------------------------------------------------------- the reviewer's offer (`hub webhook --fix`)


def own_pull_request(client: HubClient, job: Job, identity: Identity) -> bool:
    """Whether ``job`` is a push to a pull request we opened, or whose head commit is a fix of ours."""
    if job.pr_num is None:
        return False
    api = client.api
    with hub_errors(job.repo_id, endpoint=client.endpoint):
        details = client.call(lambda: api.get_discussion_details(job.repo_id, job.pr_num))
    if identity.name and str(getattr(details, "author", "")) == identity.name:
        return True
    return is_fix_commit(*head_commit(client, job.repo_id, job.sha))


def offer_fix(client: HubClient, policy: Policy, options: FixOptions, job: Job, *, identity: Identity,
              before_post: Callable[[], bool] | None = None) -> str:
    """Offer one fix pull request for a failing push to a branch; the status (``HubFix.status``) says what happened.

    Never for a push to a pull request (a fix merges into a branch), and never for a commit
    that is itself a fix of ours (its title or message carries the marker): whatever a fix
    leaves behind, the reviewer cannot fix a fix, so no chain of pull requests can start.
    """
    if job.pr_num is not None or not job.ref.startswith("refs/heads/"):
        return "not-a-branch"
    if is_fix_commit(*head_commit(client, job.repo_id, job.sha)):
        return "own-fix"
    result = fix_repo(client, job.repo_id, policy, options, revision=job.sha, create_pr=True, identity=identity,
                      once_per_revision=True, before_post=before_post, branch=job.ref)
    return result.status
