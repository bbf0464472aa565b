"""The command line: ``ckpt-guard scan|rules|report|convert|parity|hub``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from guard import __version__
from guard.atomic import write_text_atomic
from guard.catalogue import RULES, RULES_BY_CODE
from guard.config import build_policy, find_config_file, load_config
from guard.convert_cli import convert
from guard.errors import GuardError, UsageError
from guard.findings import FAIL_ON_CHOICES
from guard.hub.cli import hub
from guard.parity_cli import parity
from guard.report import Report, ReportFormatError
from guard.reporters import REPORTERS, render

FORMATS = tuple(REPORTERS)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ckpt-guard")
def cli() -> None:
    """Check model checkpoints for dtype problems before they land."""


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


@cli.command(short_help="Scan checkpoints and model directories.")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@policy_options
@output_options
@click.option("--values", is_flag=True, help="Also read tensor data (CG201-CG204); needs numpy.")
@click.option("--no-summary", is_flag=True, help="Do not append to $GITHUB_STEP_SUMMARY.")
def scan(paths: tuple[Path, ...], fmt: str, output: Path | None, values: bool, no_summary: bool,
         **policy_flags: object) -> int:
    """Scan checkpoint files and model directories (default: the current directory)."""
    from guard.scan import scan_paths

    policy = resolve_policy(**policy_flags)  # type: ignore[arg-type]
    report = scan_paths(paths or (Path("."),), policy, values=values)
    emit(report, fmt, output, summary=not no_summary)
    return report.exit_code


@cli.command(short_help="List the rules, or explain one.")
@click.argument("code", required=False)
@click.option("--format", "-f", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text",
              show_default=True)
def rules(code: str | None, fmt: str) -> int:
    """List the rule catalogue, or explain one rule (e.g. `rules CG102`)."""
    selected = RULES
    if code is not None:
        rule = RULES_BY_CODE.get(code.upper())
        if rule is None:
            raise UsageError(f"unknown rule code {code!r}; `ckpt-guard rules` lists them")
        selected = (rule,)
    if fmt == "json":
        click.echo(json.dumps([{**r._asdict(), "severity": r.severity.value} for r in selected], indent=2))
    elif fmt == "markdown":
        click.echo("| code | name | default | needs | summary |\n|---|---|---|---|---|")
        for r in selected:
            summary = r.summary.replace("|", "\\|")
            click.echo(f"| {r.code} | {r.name} | {r.severity.value} | {r.needs} | {summary} |")
    elif code is None:
        for r in selected:
            click.echo(f"{r.code}  {r.name:<28} {r.severity.value:<8} {r.summary}")
    else:
        r = selected[0]
        click.echo(f"{r.code} {r.name} (default severity: {r.severity.value}; needs: {r.needs})\n")
        click.echo(f"{r.summary}\n\nExample: {r.example}\n\nFix: {r.fix}")
    return 0


@cli.command("report", short_help="Render a saved JSON result in another format.")
@click.argument("result", type=click.Path(dir_okay=False, path_type=Path))
@output_options
@click.option("--fail-on", type=click.Choice(FAIL_ON_CHOICES), help="Override the saved fail-on.")
def report_cmd(result: Path, fmt: str, output: Path | None, fail_on: str | None) -> int:
    """Render a saved JSON result (`scan --format json -o r.json`) in another format."""
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
        report = Report.from_json(data)
    except OSError as exc:
        raise UsageError(f"{result}: cannot read ({exc.strerror})") from None
    except (ValueError, ReportFormatError) as exc:
        raise UsageError(f"{result}: {str(exc).splitlines()[0]}") from None
    if fail_on:
        report.policy["fail_on"] = fail_on
    emit(report, fmt, output, summary=False)
    return report.exit_code


cli.add_command(convert)
cli.add_command(parity)
cli.add_command(hub)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name="ckpt-guard",
                          standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("ckpt-guard: interrupted", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return 2
    except GuardError as exc:
        click.echo(f"ckpt-guard: error: {exc}", err=True)
        return 2
    except KeyboardInterrupt:
        click.echo("ckpt-guard: interrupted", err=True)
        return 130
    return result if isinstance(result, int) else 0
