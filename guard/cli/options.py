"""What the commands share: the policy and output flags, and `emit`.  Imports no command."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from guard.config import build_policy, find_config_file, load_config
from guard.errors import GuardError, UsageError
from guard.report import Report
from guard.findings import FAIL_ON_CHOICES
from guard.reporters import REPORTERS, render

FORMATS = tuple(REPORTERS)


def policy_options(func):  # type: ignore[no-untyped-def]
    """The policy flags shared by `scan`, `hub scan` and `hub upload`."""
    options = [
        click.option("--expect", metavar="DTYPE|uniform|config",
                     help="Expected floating dtype: fp32 (default), bf16, fp16, uniform, or config."),
        click.option("--keep-fp32", "keep_fp32", multiple=True, metavar="PATTERN",
                     help="Tensor-name glob that may stay fp32 under a lower --expect (repeatable; "
                          "added to the default norm patterns)."),
        click.option("--target", "targets", multiple=True, metavar="FRAMEWORK[:DTYPE]",
                     help="Conversion target: torch, flax, jax, numpy, optionally with a cast dtype "
                          "(torch:fp16). Repeatable; default torch and flax."),
        click.option("--select", multiple=True, metavar="CODES", help="Rule code prefixes to enable."),
        click.option("--extend-select", multiple=True, metavar="CODES", help="Add to the selection."),
        click.option("--ignore", multiple=True, metavar="CODES", help="Rule code prefixes to disable."),
        click.option("--fail-on", type=click.Choice(FAIL_ON_CHOICES),
                     help="Lowest severity that fails the run (default: error)."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
                     help="Config file (default: nearest .ckpt-guard.toml or pyproject.toml)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def resolve_policy(*, config_file: Path | None, expect: str | None, keep_fp32: tuple[str, ...],
                   targets: tuple[str, ...], select: tuple[str, ...], extend_select: tuple[str, ...],
                   ignore: tuple[str, ...], fail_on: str | None):  # type: ignore[no-untyped-def]
    if config_file is not None and not config_file.is_file():
        raise UsageError(f"{config_file}: config file not found")
    path = config_file or find_config_file()
    overrides = {
        "expect": expect, "keep-fp32": keep_fp32, "targets": targets, "select": select,
        "extend-select": extend_select, "ignore": ignore, "fail-on": fail_on,
    }
    return build_policy(load_config(path), source=str(path) if path else None, overrides=overrides)


def output_options(func):  # type: ignore[no-untyped-def]
    func = click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
                        help="Write the report to FILE instead of stdout.")(func)
    func = click.option("--format", "-f", "fmt", type=click.Choice(FORMATS), default="text",
                        show_default=True, help="Output format.")(func)
    return func


def emit(report: Report, fmt: str, output: Path | None, *, summary: bool = True) -> None:
    """Print or write the report; append the job summary under GitHub Actions."""
    if output is not None:
        from guard.atomic import write_text_atomic  # tempfile: only when writing a file

        write_text_atomic(output, render(report, fmt))
    else:
        color = fmt == "text" and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        click.echo(render(report, fmt, color=color), nl=False)
    if summary:
        append_step_summary(report)


def append_step_summary(report: Report) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if os.environ.get("GITHUB_ACTIONS") != "true" or not path:
        return
    try:
        text = render(report, "markdown")
    except GuardError:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        click.echo(f"ckpt-guard: warning: cannot write the job summary to {path} ({exc.strerror})", err=True)
