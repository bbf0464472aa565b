"""`ckpt-guard parity TORCH_DIR FLAX_DIR`: the parity smoke test as a report."""

from __future__ import annotations

from pathlib import Path

import click

from guard.atomic import write_text_atomic
from guard.errors import UsageError
from guard.reporters import REPORTERS


@click.command(short_help="Compare PyTorch and Flax outputs of one model.")
@click.argument("torch_dir", type=click.Path(path_type=Path))
@click.argument("flax_dir", type=click.Path(path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the generated inputs.")
@click.option("--format", "-f", "fmt", type=click.Choice(tuple(REPORTERS)), default="text", show_default=True,
              help="Output format.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report to FILE instead of stdout.")
@click.option("--verbose", "-v", is_flag=True, help="Show the libraries' own warnings and log lines.")
def parity(torch_dir: Path, flax_dir: Path, seed: int, fmt: str, output: Path | None, verbose: bool) -> int:
    """Compare PyTorch and Flax outputs of the same model (transformers' paired classes)."""
    for directory in (torch_dir, flax_dir):
        if not directory.is_dir():
            raise UsageError(f"{directory}: not a directory")
    from guard.quiet import quiet_libraries

    with quiet_libraries(verbose=verbose):
        return _parity(torch_dir, flax_dir, seed, fmt, output)


def _parity(torch_dir: Path, flax_dir: Path, seed: int, fmt: str, output: Path | None) -> int:
    from guard.parity.run import run_parity  # torch, jax, flax, transformers: the `parity` extra
    from guard.inventory import discover_models, load_local_model
    from guard.report import ModelSummary, Report
    from guard.reporters import render

    findings, figures = run_parity(torch_dir, flax_dir, seed=seed)
    report = Report(findings=findings, policy={"fail_on": "error"}, extra={"parity": figures})
    for model in discover_models([torch_dir, flax_dir]):  # headers only: the dtype tables of both sides
        if Path(model.directory) in (Path(torch_dir), Path(flax_dir)):
            report.models.append(ModelSummary.from_inventory(load_local_model(model)))
    report.findings = report.sorted_findings()
    text = render(report, fmt)
    if output is not None:
        write_text_atomic(output, text)
    else:
        click.echo(text, nl=False)
    return report.exit_code
