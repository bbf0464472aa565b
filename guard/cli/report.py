"""`ckpt-guard report RESULT.json`: another view of a saved JSON result."""

from __future__ import annotations

from pathlib import Path

import click

from guard import jsonload
from guard.cli.options import emit, output_options
from guard.errors import UsageError
from guard.findings import FAIL_ON_CHOICES
from guard.report import Report, ReportFormatError


@click.command("report", short_help="Render a saved JSON result in another format.")
@click.argument("result", type=click.Path(dir_okay=False, path_type=Path))
@output_options
@click.option("--fail-on", type=click.Choice(FAIL_ON_CHOICES), help="Override the saved fail-on.")
def report_cmd(result: Path, fmt: str, output: Path | None, fail_on: str | None) -> int:
    """Render a saved JSON result (`scan --format json -o r.json`) in another format."""
    try:
        data = jsonload.loads(result.read_text(encoding="utf-8"))
        report = Report.from_json(data)
    except OSError as exc:
        raise UsageError(f"{result}: cannot read ({exc.strerror})") from None
    except (ValueError, ReportFormatError) as exc:
        raise UsageError(f"{result}: {str(exc).splitlines()[0]}") from None
    if fail_on:
        report.policy["fail_on"] = fail_on
    emit(report, fmt, output, summary=False)
    return report.exit_code
