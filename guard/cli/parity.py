"""`ckpt-guard parity TORCH_DIR FLAX_DIR`: the parity smoke test as a report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from guard import DOCS_URL
from guard.atomic import write_text_atomic
from guard.cli.convert import TableChoice
from guard.errors import UsageError
from guard.reporters import REPORTERS
from guard.targets import against_choices, against_help


# \b: the epilog unwrapped, as click would break the URL at its hyphens
@click.command(short_help="Compare PyTorch and Flax outputs of one model.",
               epilog=f"\b\nThe --against stacks, what each reads and where it deviates: {DOCS_URL}jax.md")
@click.argument("torch_dir", type=click.Path(path_type=Path))
@click.argument("flax_dir", type=click.Path(path_type=Path), required=False)
@click.option("--against", "against", type=TableChoice(against_choices), default=None, help=against_help())
@click.option("--against-python", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The Python of an environment where the --against library is installed (default: "
                   "$CKPT_GUARD_AGAINST_PYTHON, else this process when it has the library, else the environment "
                   "`ckpt-guard env install STACK` builds).")
@click.option("--flax-python", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The Python of a transformers-4 environment to run the Flax side in (transformers 5 has no Flax "
                   "models). Default: $CKPT_GUARD_FLAX_PYTHON, else this process when its transformers is 4.x, else "
                   "the environment `ckpt-guard env install tf4` builds.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the generated inputs.")
@click.option("--format", "-f", "fmt", type=click.Choice(tuple(REPORTERS)), default="text", show_default=True,
              help="Output format.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report to FILE instead of stdout.")
@click.option("--drift/--no-drift", default=None,
              help="Also run the JAX fp32 pass at JAX's default matmul precision and report its drift "
                   "(a figure, never a failure; with --against, each load's, in the stack's worker). "
                   "Default: on a TPU or GPU only.")
@click.option("--verbose", "-v", is_flag=True, help="Show the libraries' own warnings and log lines.")
def parity(torch_dir: Path, flax_dir: Path | None, against: str | None, against_python: Path | None, seed: int,
           fmt: str, output: Path | None, drift: bool | None, verbose: bool, flax_python: Path | None = None) -> int:
    """Compare PyTorch and Flax outputs of the same model (transformers' paired classes), or (--against)
    check that a JAX stack loads an HF checkpoint right."""
    if (flax_dir is None) == (against is None):
        raise UsageError("give FLAX_DIR or --against STACK (one of them)")
    for directory in (torch_dir, flax_dir):
        if directory is not None:
            _needs_config(directory)
    if against is not None:
        from guard.cli.parity_against import parity_against

        return parity_against(torch_dir, against, against_python, seed, fmt, output, verbose, drift)
    assert flax_dir is not None  # given when --against is not (checked above)
    from guard.parity.needs import flax_side
    from guard.quiet import quiet_libraries

    found = flax_side(flax_python, "parity")  # where the Flax side runs, or the one line saying why not
    python = None if found.in_process else found.python
    with quiet_libraries(verbose=verbose):
        return _parity(torch_dir, flax_dir, seed, fmt, output, drift, python, found.figures())


def _parity(torch_dir: Path, flax_dir: Path, seed: int, fmt: str, output: Path | None, drift: bool | None,
            flax_python: Path | None = None, environment: dict[str, Any] | None = None) -> int:
    from guard.inventory import discover_models, load_local_model
    from guard.parity.run import run_parity  # torch, jax, flax, transformers: the `parity` extra
    from guard.report import ModelSummary, Report
    from guard.reporters import render

    findings, figures = run_parity(torch_dir, flax_dir, seed=seed, drift=drift, flax_python=flax_python)
    if environment is not None:  # where the Flax side ran, and a version outside the checked set (guard.envs.find)
        figures["environment"] = environment
    report = Report(findings=findings, policy={"fail_on": "error"}, extra={"parity": figures})
    for model in discover_models([torch_dir, flax_dir]):  # headers only: the dtype tables of both sides
        if Path(model.directory) in (Path(torch_dir), Path(flax_dir)):
            report.models.append(ModelSummary.from_inventory(load_local_model(model)))
    report.findings = report.sorted_findings()
    text = render(report, fmt)
    if output is not None:
        write_text_atomic(output, text)
    else:
        from guard.quiet import report_stdout  # the report's stdout: a library's print goes elsewhere

        click.echo(text, nl=False, file=report_stdout())
    return report.exit_code


def _needs_config(directory: Path) -> None:
    """Each side builds the model as transformers does, from config.json beside the weights: one line, before
    any environment is looked for, where a bare ``[Errno 2]`` used to come."""
    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory")
    if not (directory / "config.json").is_file():
        raise UsageError(f"{directory}: no config.json: parity builds the model from it, as transformers does; "
                         "save the model with save_pretrained, or put the config.json it was trained with beside "
                         "the weights")
