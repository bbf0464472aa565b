"""`ckpt-guard hub scan|upload|webhook`: the command wiring of ``guard.hub``.

huggingface_hub, starlette and uvicorn are imported inside the commands, so
`--help` works without the `hub` extra and a command run without it fails with
the one-line install hint.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from guard.cli.options import emit, output_options, policy_options, resolve_policy
from guard.errors import GuardError, UsageError

token_option = click.option(
    "--token", metavar="TOKEN",
    help="Hub token (default: HF_TOKEN or the stored `hf auth login`). Never printed.")
timeout_option = click.option(
    "--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
    help="Seconds per Hub request; failures retry a bounded number of times.")


@click.command("scan")
@click.argument("repo_ids", nargs=-1, metavar="REPO_ID...")
@click.option("--revision", metavar="REV", help="Branch, tag, commit or refs/pr/N (default: main).")
@click.option("--author", metavar="ORG", help="Scan every model of this user or organisation.")
@click.option("--jobs", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Repositories scanned at once.")
@token_option
@timeout_option
@click.option("--no-summary", is_flag=True, help="Do not append to $GITHUB_STEP_SUMMARY.")
@policy_options
@output_options
def scan_cmd(repo_ids: tuple[str, ...], revision: str | None, author: str | None, jobs: int,
             token: str | None, timeout: float, no_summary: bool, fmt: str, output: Path | None,
             **policy_flags: object) -> int:
    """Scan Hub repositories through ranged reads of their headers (no weights downloaded)."""
    from guard.hub.client import HubClient
    from guard.hub.scan import list_author_models, scan_hub

    if not repo_ids and not author:
        raise UsageError("give at least one REPO_ID, or --author ORG")
    policy = resolve_policy(**policy_flags)  # type: ignore[arg-type]
    client = HubClient(token=token, timeout=timeout)
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
@token_option
@timeout_option
@policy_options
@output_options
def upload_cmd(local_dir: Path, repo_id: str, revision: str | None, create_pr: bool, private: bool,
               commit_message: str | None, token: str | None, timeout: float, fmt: str, output: Path | None,
               **policy_flags: object) -> int:
    """Scan LOCAL_DIR, then upload it to REPO_ID only if the policy passes (or as a PR with the report)."""
    from guard.hub.upload import gated_upload

    if not local_dir.is_dir():
        raise UsageError(f"{local_dir}: not a directory")
    policy = resolve_policy(**policy_flags)  # type: ignore[arg-type]
    outcome = gated_upload(local_dir, repo_id, policy, token=token, timeout=timeout, revision=revision,
                           create_pr=create_pr, private=private, commit_message=commit_message)
    emit(outcome.report, fmt, output, summary=False)
    click.echo(outcome.message, err=True)
    return outcome.report.exit_code


@click.command("webhook")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--secret", metavar="S", help="Expected X-Webhook-Secret (default: $CKPT_GUARD_WEBHOOK_SECRET).")
@click.option("--workers", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Scans run at once in the background.")
@token_option
@timeout_option
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Policy config file (default: nearest .ckpt-guard.toml or pyproject.toml).")
def webhook_cmd(host: str, port: int, secret: str | None, workers: int, token: str | None, timeout: float,
                config_file: Path | None) -> int:
    """Serve POST /webhook: scan every pushed revision and answer on the Hub."""
    from guard.hub.webhook import serve

    secret = secret or os.environ.get("CKPT_GUARD_WEBHOOK_SECRET")
    if not secret:
        raise UsageError("a webhook secret is required: --secret or CKPT_GUARD_WEBHOOK_SECRET")
    policy = resolve_policy(config_file=config_file, expect=None, keep_fp32=(), targets=(), select=(),
                            extend_select=(), ignore=(), fail_on=None)
    serve(host=host, port=port, secret=secret, policy=policy, token=token, timeout=timeout, workers=workers)
    return 0


@click.group()
def hub() -> None:
    """Scan Hub repositories remotely, gate uploads, review pushes."""


hub.add_command(scan_cmd)
hub.add_command(upload_cmd)
hub.add_command(webhook_cmd)
