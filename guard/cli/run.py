"""What commands do once their flags are parsed: resolve the policy, run a scan, emit the report.

No click here: the hook's fast path (``guard.cli.main``) calls ``run_scan`` directly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from guard.config import Policy, build_policy, find_config_file, load_config
from guard.errors import GuardError, UsageError
from guard.report import Report
from guard.reporters import render

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (~3 ms, the hook's path)
if TYPE_CHECKING:  # no pathlib on the hook's path either (guard.paths)
    from pathlib import Path
    from typing import TypedDict

    from typing_extensions import Unpack  # typing's from 3.11

    class PolicyFlags(TypedDict):
        """The policy flags as the CLI parses them (guard.cli.flags.POLICY_FLAGS): resolve_policy's arguments."""

        config_file: Path | None
        expect: str | None
        keep_fp32: tuple[str, ...]
        targets: tuple[str, ...]
        select: tuple[str, ...]
        extend_select: tuple[str, ...]
        ignore: tuple[str, ...]
        fail_on: str | None


def resolve_policy(*, config_file: Path | None, expect: str | None, keep_fp32: tuple[str, ...],
                   targets: tuple[str, ...], select: tuple[str, ...], extend_select: tuple[str, ...],
                   ignore: tuple[str, ...], fail_on: str | None) -> Policy:
    if config_file is not None and not os.path.isfile(config_file):
        raise UsageError(f"{config_file}: config file not found")
    path = config_file or find_config_file()
    overrides = {
        "expect": expect, "keep-fp32": keep_fp32, "targets": targets, "select": select,
        "extend-select": extend_select, "ignore": ignore, "fail-on": fail_on,
    }
    return build_policy(load_config(path), source=str(path) if path else None, overrides=overrides)


def run_scan(paths: tuple[str | Path, ...], fmt: str, output: Path | None, values: bool, no_summary: bool,
             **policy_flags: Unpack[PolicyFlags]) -> int:
    from guard.scan import scan_paths

    policy = resolve_policy(**policy_flags)
    report = scan_paths(paths or (".",), policy, values=values, named=bool(paths))  # "." unnamed: no CG010
    emit(report, fmt, output, summary=not no_summary)
    return report.exit_code


def emit(report: Report, fmt: str, output: Path | None, *, summary: bool = True) -> None:
    """Print or write the report; append the job summary under GitHub Actions."""
    write_rendered(lambda as_fmt, color=False: render(report, as_fmt, color=color), fmt, output,
                   summary=(lambda: render(report, "markdown")) if summary else None)


def write_rendered(render_as: Callable[..., str], fmt: str, output: Path | None, *,
                   summary: Callable[[], str] | None) -> None:
    """``render_as(fmt)`` to ``output`` (atomically) or to stdout (colour on a terminal), then the markdown
    ``summary()`` appended to the job summary under GitHub Actions: a scan's report and a diff's change."""
    if output is not None:
        from guard.atomic import write_text_atomic  # tempfile: only when writing a file

        write_text_atomic(output, render_as(fmt))
    else:
        quiet = sys.modules.get("guard.quiet")  # loaded by the commands that run libraries: their stdout is quieted
        stdout = quiet.report_stdout() if quiet is not None else sys.stdout
        color = fmt == "text" and stdout.isatty() and "NO_COLOR" not in os.environ
        stdout.write(render_as(fmt, color=color))
        stdout.flush()
    if summary is not None:
        append_step_summary(summary)


def append_step_summary(markdown: Callable[[], str]) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if os.environ.get("GITHUB_ACTIONS") != "true" or not path:
        return
    try:
        text = markdown()
    except GuardError:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        print(f"ckpt-guard: warning: cannot write the job summary to {path} ({exc.strerror})", file=sys.stderr)
