"""`ckpt-guard parity SRC --against STACK`: the report of ``guard.against.run``, as `parity` writes it."""

from __future__ import annotations

from pathlib import Path

import click

from guard.atomic import write_text_atomic
from guard.errors import UsageError


def parity_against(src: Path, against: str, python: Path | None, seed: int, fmt: str, output: Path | None,
                   verbose: bool, drift: bool | None = None) -> int:
    if not src.is_dir():
        raise UsageError(f"{src}: not a directory")
    from guard.quiet import quiet_libraries

    with quiet_libraries(verbose=verbose):
        from guard.against.run import run_against
        from guard.inventory import discover_models, load_local_model
        from guard.report import ModelSummary, Report
        from guard.reporters import render

        findings, figures = run_against(src, against, seed=seed, python=python, drift=drift)
        report = Report(findings=findings, policy={"fail_on": "error"}, extra={"parity": figures})
        for model in discover_models([src]):
            if Path(model.directory) == Path(src):
                report.models.append(ModelSummary.from_inventory(load_local_model(model)))
        report.findings = report.sorted_findings()
        text = render(report, fmt)
    if output is not None:
        write_text_atomic(output, text)
    else:
        from guard.quiet import report_stdout  # the report's stdout: a library's print goes elsewhere

        click.echo(text, nl=False, file=report_stdout())
    return report.exit_code
