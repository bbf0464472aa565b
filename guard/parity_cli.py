"""`ckpt-guard parity TORCH_DIR FLAX_DIR`: the parity smoke test as a report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from guard.atomic import write_text_atomic
from guard.errors import UsageError
from guard.reporters import REPORTERS


@click.command()
@click.argument("torch_dir", type=click.Path(path_type=Path))
@click.argument("flax_dir", type=click.Path(path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the generated inputs.")
@click.option("--format", "-f", "fmt", type=click.Choice(tuple(REPORTERS)), default="text", show_default=True,
              help="Output format.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report to FILE instead of stdout.")
def parity(torch_dir: Path, flax_dir: Path, seed: int, fmt: str, output: Path | None) -> int:
    """Compare PyTorch and Flax outputs of the same model (transformers' paired classes)."""
    for directory in (torch_dir, flax_dir):
        if not directory.is_dir():
            raise UsageError(f"{directory}: not a directory")
    from guard.parity import run_parity  # torch, jax, flax, transformers: the `parity` extra
    from guard.inventory import discover_models, load_local_model
    from guard.report import ModelSummary, Report
    from guard.reporters import render

    findings, figures = run_parity(torch_dir, flax_dir, seed=seed)
    report = Report(findings=findings, policy={"fail_on": "error"}, extra={"parity": figures})
    for model in discover_models([torch_dir, flax_dir]):  # headers only: the dtype tables of both sides
        if model.directory in (torch_dir, flax_dir):
            report.models.append(ModelSummary.from_inventory(load_local_model(model)))
    report.findings = report.sorted_findings()
    text = render(report, fmt)
    if fmt == "text":
        text = summary_text(figures) + text
    if output is not None:
        write_text_atomic(output, text)
    else:
        click.echo(text, nl=False)
    return report.exit_code


def summary_text(figures: dict[str, Any]) -> str:
    """One line per comparison: its bound, the worst output and top-1 (the JSON has every figure)."""
    from guard.reporters.inert import inert_text

    lines = [f"parity {inert_text(str(figures.get('torch_dir')))} vs {inert_text(str(figures.get('flax_dir')))}"
             f" ({inert_text(str(figures.get('torch_class', '-')))} / "
             f"{inert_text(str(figures.get('flax_class', '-')))}, seed {figures.get('seed')})"]
    for comp in figures.get("comparisons", []):
        outputs = [o for o in comp["outputs"].values() if "max_rel" in o]
        worst = max((o["max_rel"] for o in outputs), default=0.0)
        top1 = [o["top1_tie_aware"] for o in outputs if "top1_tie_aware" in o]
        tol = comp["tolerance"]
        lines.append(f"  {comp['name']:<26} {'ok  ' if comp['passed'] else 'FAIL'} max rel {worst:.2e} "
                     f"(bound {tol['max_rel']:.0e})" + (f", top-1 {min(top1):.1%}" if top1 else ""))
    return "\n".join(lines) + "\n\n"
