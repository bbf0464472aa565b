"""`ckpt-guard scan PATHS`: the header scan, the hot path of the hook and the Action."""

from __future__ import annotations

from pathlib import Path

import click

from guard.cli.options import emit, output_options, policy_options, resolve_policy


@click.command(short_help="Scan checkpoints and model directories.")
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
