"""`ckpt-guard hub scan|upload|fix|diff|webhook|jobs`: the command wiring of ``guard.hub``.

huggingface_hub, starlette, uvicorn and psycopg are imported inside the
commands, so `--help` works without the `hub` extra and a command run without
it fails with the one-line install hint.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import click

from guard.cli.options import emit, output_options, policy_options, resolve_policy
from guard.cli.review import DIFF_FORMATS  # the diff views' table, as `diff` reads it
from guard.errors import GuardError, UsageError

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from 3.11

    from guard.cli.run import PolicyFlags
    from guard.hub.client import HubClient

token_option = click.option(
    "--token", metavar="TOKEN",
    help="Hub token (default: HF_TOKEN or the stored `hf auth login`). Never printed.")
timeout_option = click.option(
    "--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
    help="Seconds per Hub request; failures retry a bounded number of times.")
deadline_option = click.option(
    "--retry-deadline", type=click.FloatRange(min=0.0), default=300.0, show_default=True,
    help="Seconds one Hub call may spend retrying (429/503 after their Retry-After, other 5xx with back-off).")
max_rps_option = click.option(
    "--max-rps", type=click.FloatRange(min=0.0, min_open=True), metavar="RATE",
    help="At most RATE Hub requests per second, all threads together (default: no limit).")
state_option = click.option(
    "--state", metavar="PATH|URL",
    help="Job queue: a SQLite file (default: $XDG_CACHE_HOME/ckpt-guard/reviewer.sqlite3) "
         "or postgresql://... shared by replicas on several hosts.")


def make_client(token: str | None, timeout: float, *, retry_deadline: float,
                max_rps: float | None = None) -> HubClient:
    from guard.hub.client import HubClient
    from guard.hub.retry import RateLimiter

    return HubClient(token=token, timeout=timeout, deadline=retry_deadline,
                     limiter=RateLimiter(max_rps) if max_rps else None)


@click.command("scan")
@click.argument("repo_ids", nargs=-1, metavar="REPO_ID...")
@click.option("--revision", metavar="REV", help="Branch, tag, commit or refs/pr/N (default: main).")
@click.option("--author", metavar="ORG", help="Scan every model of this user or organisation.")
@click.option("--jobs", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Repositories scanned at once.")
@max_rps_option
@token_option
@timeout_option
@deadline_option
@click.option("--no-summary", is_flag=True, help="Do not append to $GITHUB_STEP_SUMMARY.")
@policy_options
@output_options
def scan_cmd(repo_ids: tuple[str, ...], revision: str | None, author: str | None, jobs: int,
             max_rps: float | None, token: str | None, timeout: float, retry_deadline: float, no_summary: bool,
             fmt: str, output: Path | None, **policy_flags: Unpack[PolicyFlags]) -> int:
    """Scan Hub repositories through ranged reads of their headers (no weights downloaded)."""
    from guard.hub.scan import list_author_models, scan_hub

    if not repo_ids and not author:
        raise UsageError("give at least one REPO_ID, or --author ORG")
    policy = resolve_policy(**policy_flags)
    client = make_client(token, timeout, retry_deadline=retry_deadline, max_rps=max_rps)
    targets = list(repo_ids)
    if author:
        targets += [r for r in list_author_models(client, author) if r not in targets]
        if not targets:
            raise GuardError(f"{author} has no models on {client.endpoint} that this token can see")
    result = scan_hub(targets, policy, client, revision=revision, repo_workers=jobs)
    if len(result.errors) == 1 and len(result.repos) == 1:
        raise result.errors[0]
    if len(result.errors) < len(result.repos):  # a report only where something was scanned
        emit(result.report, fmt, output, summary=not no_summary)
    for error in result.errors:
        click.echo(f"ckpt-guard: error: {error}", err=True)
    return 2 if result.errors else result.report.exit_code


@click.command("upload")
@click.argument("local_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("repo_id")
@click.option("--revision", metavar="BRANCH", help="Branch to upload to (created from main if missing).")
@click.option("--create-pr", is_flag=True, help="Open a pull request carrying the report instead of pushing.")
@click.option("--private", is_flag=True, help="Create the repository as private (if it does not exist).")
@click.option("--commit-message", metavar="TEXT", help="Commit title (default: 'Upload with ckpt-guard').")
@click.option("--values", is_flag=True, help="Also read tensor data (CG201-CG207: NaN, overflow, dead weights).")
@token_option
@timeout_option
@deadline_option
@policy_options
@output_options
def upload_cmd(local_dir: Path, repo_id: str, revision: str | None, create_pr: bool, private: bool,
               commit_message: str | None, values: bool, token: str | None, timeout: float, retry_deadline: float,
               fmt: str, output: Path | None, **policy_flags: Unpack[PolicyFlags]) -> int:
    """Scan LOCAL_DIR, then upload it to REPO_ID only if the policy passes (or as a PR with the report)."""
    from guard.hub.upload import gated_upload

    if not local_dir.is_dir():
        raise UsageError(f"{local_dir}: not a directory")
    policy = resolve_policy(**policy_flags)
    outcome = gated_upload(local_dir, repo_id, policy, token=token, timeout=timeout, revision=revision,
                           create_pr=create_pr, private=private, commit_message=commit_message,
                           retry_deadline=retry_deadline, values=values)
    emit(outcome.report, fmt, output, summary=False)
    click.echo(outcome.message, err=True)
    return outcome.report.exit_code


@click.command("fix")
@click.argument("repo_id")
@click.option("--revision", metavar="REV", help="Branch or commit to fix (default: main); the pull request "
                                                "merges into that branch (main for a commit).")
@click.option("--create-pr", is_flag=True, help="Open one pull request with every fix (default: a dry run that "
                                                 "prints the plan and exits 1 when something can be fixed).")
@click.option("--replace", is_flag=True, help="Allow fixes that replace an existing weight file.")
@click.option("--cast", is_flag=True, help="CG101/CG102: write the set in the --expect dtype.")
@click.option("--to-config", is_flag=True, help="CG103: cast the weights to config.json's dtype instead.")
@click.option("--allow-lossy", is_flag=True, help="Write a narrowing cast that loses values (reported).")
@click.option("--add", "add", multiple=True, metavar="WHAT",
              help="Add a copy the repository lacks: flax, orbax, safetensors, variant:fp16, variant:bf16.")
@max_rps_option
@token_option
@timeout_option
@deadline_option
@policy_options
@output_options
def fix_cmd(repo_id: str, revision: str | None, create_pr: bool, replace: bool, cast: bool, to_config: bool,
            allow_lossy: bool, add: tuple[str, ...], max_rps: float | None, token: str | None, timeout: float,
            retry_deadline: float, fmt: str, output: Path | None, **policy_flags: Unpack[PolicyFlags]) -> int:
    """Plan the fixes of REPO_ID from its remote headers; with --create-pr, open one pull request with them.

    Only the files the fixes read are downloaded; every file written is verified before it is
    proposed.  A second run finds its open pull request, or sees the fixes merged, and opens nothing.
    """
    from guard.fix.context import FixOptions
    from guard.hub.fix import fix_repo, target_branch
    from guard.hub.fix_text import plan_text

    target_branch(revision)  # a usage error before anything is asked of the Hub
    policy = resolve_policy(**policy_flags)
    client = make_client(token, timeout, retry_deadline=retry_deadline, max_rps=max_rps)
    options = FixOptions(replace=replace, cast=cast, to_config=to_config, allow_lossy=allow_lossy, add=add)
    result = fix_repo(client, repo_id, policy, options, revision=revision, create_pr=create_pr,
                      select=tuple(policy_flags.get("select") or ()),
                      ignore=tuple(policy_flags.get("ignore") or ()))
    report = result.after or result.before
    report.extra["fix"] = result.to_json()
    if fmt == "text" and output is None:
        click.echo(plan_text(result), nl=False)
    else:
        emit(report, fmt, output, summary=False)
    if result.message and (fmt != "text" or output is not None):
        click.echo(result.message, err=True)
    return result.exit_code


@click.command("diff", short_help="Compare two revisions of a repository from their headers (no download).")
@click.argument("repo_id")
@click.option("--from", "old", required=True, metavar="REV", help="The revision before: branch, tag, commit or "
                                                                  "refs/pr/N.")
@click.option("--to", "new", default="main", show_default=True, metavar="REV", help="The revision after.")
@click.option("--format", "-f", "fmt", type=click.Choice(DIFF_FORMATS), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report to this file (written to a temporary name, then renamed).")
@max_rps_option
@token_option
@timeout_option
@deadline_option
@policy_options
def diff_cmd(repo_id: str, old: str, new: str, fmt: str, output: Path | None, max_rps: float | None,
             token: str | None, timeout: float, retry_deadline: float, **policy_flags: Unpack[PolicyFlags]) -> int:
    """Compare two revisions of REPO_ID from their remote headers: tensors added, removed, recast and
    reshaped, sizes, and the findings the change introduces and resolves (no weights downloaded).

    Exit 0 when the change introduces no finding at or above --fail-on, 1 when it does, 2 when it cannot
    run (a revision that does not exist, an unreachable Hub).
    """
    from guard.diff import render_change
    from guard.hub.diff import hub_change

    policy = resolve_policy(**policy_flags)
    client = make_client(token, timeout, retry_deadline=retry_deadline, max_rps=max_rps)
    result = hub_change(client, repo_id, old, new, policy)
    text = render_change(result.change, fmt)
    if fmt == "json":  # what each side cost: the header-only promise, checkable
        data = json.loads(text)
        data.setdefault("extra", {})["hub"] = {"endpoint": client.endpoint, **result.traffic()}
        text = json.dumps(data, indent=1) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        from guard.atomic import write_text_atomic

        write_text_atomic(output, text)
    return result.change.exit_code


@click.command("webhook")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--secret", metavar="S", help="Expected X-Webhook-Secret (default: $CKPT_GUARD_WEBHOOK_SECRET).")
@click.option("--workers", type=click.IntRange(0, 64), default=4, show_default=True,
              help="Reviews run at once (0: only accept deliveries, for a separate `--once` job).")
@state_option
@click.option("--once", is_flag=True, help="Serve nothing: review every job that is due, then exit (cron).")
@click.option("--lease", type=click.FloatRange(min=0.5), default=60.0, show_default=True,
              help="Seconds a claimed job stays held without a heartbeat (a dead worker's jobs return after it).")
@click.option("--max-attempts", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Attempts of a failing job before it is marked failed.")
@click.option("--retry-backoff", type=click.FloatRange(min=0.0), default=30.0, show_default=True,
              help="Seconds before a failed job's second attempt; doubles after, jittered.")
@max_rps_option
@click.option("--log-format", type=click.Choice(("text", "json")), default="text", show_default=True,
              help="Log lines on stderr: text, or one JSON object per line.")
@click.option("--fix", is_flag=True, help="Also offer one fix pull request for a failing push to a branch "
                                          "(safe fixes only); pushes to our own pull requests are not reviewed.")
@token_option
@timeout_option
@deadline_option
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Policy config file (default: nearest .ckpt-guard.toml or pyproject.toml).")
def webhook_cmd(host: str, port: int, secret: str | None, workers: int, state: str | None, once: bool,
                lease: float, max_attempts: int, retry_backoff: float, max_rps: float | None, log_format: str,
                fix: bool, token: str | None, timeout: float, retry_deadline: float, config_file: Path | None) -> int:
    """Serve POST /webhook: queue every pushed revision durably, scan it and answer on the Hub."""
    from guard.hub import service
    from guard.hub.queue import open_queue
    from guard.hub.reviewer import ReviewSettings

    secret = secret or os.environ.get("CKPT_GUARD_WEBHOOK_SECRET")
    if not secret and not once:
        raise UsageError("a webhook secret is required: --secret or CKPT_GUARD_WEBHOOK_SECRET")
    policy = resolve_policy(config_file=config_file, expect=None, keep_fp32=(), targets=(), select=(),
                            extend_select=(), ignore=(), fail_on=None)
    settings = ReviewSettings(workers=workers, lease=lease, max_attempts=max_attempts, retry_backoff=retry_backoff,
                              fix=fix)
    client = make_client(token, timeout, retry_deadline=retry_deadline, max_rps=max_rps)
    if not once:
        service.require_server()
    queue = open_queue(state)
    if once:
        outcomes = service.drain(policy=policy, client=client, queue=queue, settings=settings,
                                 log_format=log_format)
        return 2 if outcomes["failed"] else 0
    service.serve(host=host, port=port, secret=secret or "", policy=policy, client=client, queue=queue,
                  settings=settings, log_format=log_format)
    return 0


@click.command("jobs")
@state_option
@click.option("--show", "states", multiple=True, type=click.Choice(("queued", "running", "answered", "skipped",
                                                                      "failed")),
              help="States to list (repeatable; default: queued, running and failed).")
@click.option("--requeue-failed", is_flag=True, help="Queue every failed job again, then list.")
@click.option("--format", "-f", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True)
def jobs_cmd(state: str | None, states: tuple[str, ...], requeue_failed: bool, fmt: str) -> int:
    """List the reviewer's queue: what waits, what runs, what failed and why."""
    from guard.hub.queue import open_queue

    queue = open_queue(state)
    try:
        if requeue_failed:
            click.echo(f"ckpt-guard: {queue.requeue_failed()} failed job(s) queued again", err=True)
        counts = queue.counts()
        listed = queue.jobs(states or ("queued", "running", "failed"))
    finally:
        queue.close()
    if fmt == "json":
        click.echo(json.dumps({"queue": queue.where, "counts": counts, "jobs": [j.to_json() for j in listed]},
                              indent=1))
        return 0
    click.echo(f"{queue.where}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    for item in listed:
        when = datetime.fromtimestamp(item.updated_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        line = f"{item.id:>6}  {item.state:<8} {item.attempts:>2}x  {when}  {item.job.repo_id} {item.job.ref} " \
               f"{item.job.sha[:12]}" + (f"  on {item.job.endpoint}" if item.job.endpoint else "")
        click.echo(line + (f"  {item.error}" if item.error else ""))
    return 0


@click.group()
def hub() -> None:
    """Scan Hub repositories remotely, compare revisions, gate uploads, propose fixes, review pushes, list the
    review queue."""


hub.add_command(scan_cmd)
hub.add_command(upload_cmd)
hub.add_command(fix_cmd)
hub.add_command(diff_cmd)
hub.add_command(webhook_cmd)
hub.add_command(jobs_cmd)
