"""`ckpt-guard rules [CODE]`: the catalogue, generated from ``guard.catalogue``."""

from __future__ import annotations

import json

import click

from guard.catalogue import RULES, RULES_BY_CODE
from guard.errors import UsageError


@click.command(short_help="List the rules, or explain one.")
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
