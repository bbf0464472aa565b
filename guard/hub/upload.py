"""The upload gate: scan a local model directory, upload it only if the policy passes.

With ``create_pr`` the upload always goes to a pull request whose description
carries the report, and the exit code still says whether the policy passed.
One ``create_commit`` per upload (not ``upload_folder``): a single predictable
commit on huggingface_hub 0.3x, 1.x and 2.x, and a PR created by that commit.

``create_repo`` and ``create_branch`` (``exist_ok``) are retried like reads.
``create_commit`` is retried only where the Hub cannot have made the commit:
a 429 on any of its requests (the rate limiter answers before the handler
runs), a 503 that carries ``Retry-After`` (a deliberate refusal), or any
retryable answer to the requests *before* the commit request (preupload,
YAML validation).  A 5xx without Retry-After or a lost connection on the
commit request itself may come after the commit was made, so it is not
repeated: the error says to look at the repository before running again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from guard.config import Policy
from guard.hub.client import HubClient, hub_errors, request_url_of, retry_read, retry_refused
from guard.hub.comment import hub_markdown
from guard.records import Record
from guard.report import Report
from guard.scan import scan_paths

DEFAULT_MESSAGE = "Upload with ckpt-guard"
# Requests create_commit makes before the commit request; none of them makes a commit.
BEFORE_COMMIT = ("/preupload/", "/api/validate-yaml", "/info/lfs/")


class UploadOutcome(Record):
    report: Report
    uploaded: bool
    message: str  # one line for stderr
    commit_url: str | None = None
    pr_url: str | None = None


def local_files(directory: Path) -> list[tuple[str, Path]]:
    """Files to upload, with upload_folder's default exclusions (.git/, .cache/huggingface/)."""
    out = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if rel.parts[0] == ".git" or rel.parts[:2] == (".cache", "huggingface") or not path.is_file():
            continue
        out.append((rel.as_posix(), path))
    return out


def gated_upload(directory: Path, repo_id: str, policy: Policy, *, token: str | None = None,
                 timeout: float = 30.0, revision: str | None = None, create_pr: bool = False,
                 private: bool = False, commit_message: str | None = None,
                 retry_deadline: float | None = None, values: bool = False) -> UploadOutcome:
    # CG120/CG121: the folder is a repository; with values, CG201-CG207 from its tensor data
    report = scan_paths([directory], policy, publishing=True, values=values)
    if report.failed and not create_pr:
        return UploadOutcome(report, False, (
            f"ckpt-guard: nothing uploaded to {repo_id}: the scan has findings at or above "
            f"fail-on={report.fail_on} (fix them, or use --create-pr to propose the upload with the report)"))
    client = HubClient(token=token, timeout=timeout)
    if retry_deadline is not None:
        client.deadline = retry_deadline
    _quiet_hub_progress_when_not_a_terminal()
    from huggingface_hub import CommitOperationAdd

    from guard.progress import progress

    files = local_files(directory)
    # Hashing happens here (sha256 per file); for large weights this is the slow part.
    operations = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(path))
                  for rel, path in progress(files, total=len(files), desc="hashing", unit="file")]
    title = commit_message or DEFAULT_MESSAGE
    verdict = "failed" if report.failed else "passed"
    if create_pr:
        description = hub_markdown(report, intro=(
            f"Automated upload proposed by ckpt-guard {_version()}: the dtype policy **{verdict}** "
            f"on the uploaded files. Review the report below before merging."))
    else:
        description = f"Scanned with ckpt-guard {_version()} before upload: policy passed."
    api = client.api
    with hub_errors(repo_id, revision=revision, endpoint=client.endpoint):
        client.call(lambda: api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True))
        if revision and revision != "main" and not revision.startswith("refs/"):
            client.call(lambda: api.create_branch(repo_id, branch=revision, exist_ok=True))
        # Retried only where no commit can have been made (see the module docstring).
        info = client.call(lambda: api.create_commit(
            repo_id, operations, commit_message=title, commit_description=description, revision=revision,
            create_pr=create_pr), retry=retry_commit)
    pr_url = getattr(info, "pr_url", None)
    where = f"pull request {pr_url}" if pr_url else f"{repo_id}@{revision or 'main'}"
    return UploadOutcome(report, True, f"ckpt-guard: uploaded {len(files)} file(s) to {where} "
                                       f"(policy {verdict})", commit_url=str(info.commit_url), pr_url=pr_url)


def retry_commit(exc: BaseException) -> bool:
    """Whether a failed ``create_commit`` may be run again without risking a second commit."""
    url = request_url_of(exc)
    if "/commit/" in url:  # the commit request itself: only if it was refused unhandled
        return retry_refused(exc)
    return retry_read(exc) and any(step in url for step in BEFORE_COMMIT)


def _quiet_hub_progress_when_not_a_terminal() -> None:
    ci = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
    if ci or not sys.stderr.isatty():
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def _version() -> str:
    from guard import __version__

    return __version__
