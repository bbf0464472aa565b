"""`ckpt-guard fix PATHS`: scan, plan every mechanical fix, and (with --write) apply, verify, re-scan.

A dry run by default: the plan is printed, nothing is written, and the exit code is 1 when
something is fixable.  --write applies the enabled fixes, scans again and exits with the
re-scan's code (1 at least when a fix was refused or rolled back).  --select / --ignore
choose which findings to fix, by code prefix as scan's do; the scan itself runs with the
configured policy, so the verdicts before and after are the project's own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from guard.cli.convert import parse_size
from guard.cli.flags import POLICY_FLAGS
from guard.cli.options import click_option
from guard.cli.run import resolve_policy
from guard.config import parse_codes
from guard.report import Report
from guard.rules.copies import ADD_WHATS

_SCAN_POLICY = tuple(f for f in POLICY_FLAGS if f.dest not in ("select", "extend_select", "ignore"))


def run_fix(paths: tuple[Path, ...], *, write: bool, select: tuple[str, ...], ignore: tuple[str, ...],
            to_config: bool, cast: bool, allow_lossy: bool, replace: bool, no_backup: bool, add: tuple[str, ...],
            values: bool, fmt: str, patch: Path | None, changed: Path | None, max_shard_size: str, verify: str,
            exit_non_zero_on_fix: bool = False, unsafe_fixes: bool = False, **policy_flags: Any) -> int:
    from guard.fix.apply import apply_plan
    from guard.fix.context import FixOptions
    from guard.fix.patch import is_text_fix, preview_text_changes, relative_to_cwd, unified_patch, write_patch
    from guard.fix.plan import plan_fixes, render_plan
    from guard.scan import scan_paths

    select, ignore = parse_codes(select, key="--select"), parse_codes(ignore, key="--ignore")
    policy = resolve_policy(select=(), extend_select=(), ignore=(), **policy_flags)
    options = FixOptions(write=write, replace=replace, backup=not no_backup, allow_lossy=allow_lossy, cast=cast,
                         to_config=to_config, values=values, max_shard_size=parse_size(max_shard_size),
                         verify=verify, add=add, unsafe_fixes=unsafe_fixes)
    targets = paths or (Path("."),)
    before = scan_paths(targets, policy, values=values, add=add)
    plan = plan_fixes(before, options, select=select, ignore=ignore)
    previews = {id(p): preview_text_changes(p, options, policy) for p in plan.enabled if is_text_fix(p)} \
        if patch is not None else {}
    if write:  # a killed run's staging directories go, even where nothing is left to fix
        from guard.fix.apply import sweep_stale_staging

        for summary in before.models:
            sweep_stale_staging(Path(summary.path))
    planned_text = render_plan(plan)  # before anything is written: sizes and verbs are the tree's as scanned
    outcomes = apply_plan(plan, options, policy) if write and plan.enabled else []
    after = scan_paths(targets, policy, values=values) if outcomes and any(o.ok for o in outcomes) else None
    if patch is not None:  # after --write, only what was applied
        applied = {id(o.planned) for o in outcomes if o.ok}
        kept = [p for p in plan.enabled if id(p) in previews and (not write or id(p) in applied)]
        write_patch(patch, unified_patch([change for p in kept for change in previews[id(p)]]))
    if changed is not None:
        from guard.atomic import write_text_atomic

        write_text_atomic(changed, "".join(f"{relative_to_cwd(Path(w))}\n" for o in outcomes for w in o.written))
    report = after or before
    report.extra["fix"] = {**plan.to_json(), "outcomes": [o.to_json() for o in outcomes],
                           "before": verdict(before), "after": verdict(after) if after else None,
                           "written": write}
    failed = any(not o.ok for o in outcomes if o.planned.enabled)
    # a fixer hook fails when it wrote anything, so the user reviews and stages it (ruff's flag of this name);
    # pre-commit notices a rewritten tracked file by itself, but never a new one such as a safetensors copy
    wrote = exit_non_zero_on_fix and any(o.ok and o.written for o in outcomes)
    code = max(report.exit_code, 1 if failed or wrote else 0) if write else 1 if plan.fixes else before.exit_code
    if fmt == "json":
        from guard.reporters import render

        sys.stdout.write(render(report, "json"))
    else:
        sys.stdout.write(text_output(plan, outcomes, before, after, write=write, planned_text=planned_text,
                                     code=code, stage=wrote))
    sys.stdout.flush()
    return code


def verdict(report: Report) -> dict[str, object]:
    return {**report.counts(), "failed": report.failed, "exit_code": report.exit_code,
            "findings": len(report.findings)}


def text_output(plan: Any, outcomes: list[Any], before: Report, after: Report | None, *, write: bool,
                planned_text: str, code: int = 0, stage: bool = False) -> str:
    from guard.reporters.inert import inert_text
    from guard.reporters.text import render_text

    out = [planned_text]
    if not write:
        waiting = " (and the flags a fix waits for)" if any(not p.enabled for p in plan.fixes) else ""
        out.append("nothing written (dry run)" + (f": apply with `ckpt-guard fix --write`{waiting}\n" if plan.fixes
                                                   else "\n"))
        return "".join(out)
    for outcome in outcomes:
        if not outcome.planned.enabled:
            continue
        mark = "fixed" if outcome.ok else "NOT FIXED"
        line = f"{mark}: {inert_text(outcome.summary, limit=400)}"
        if outcome.error:
            line += f" ({inert_text(outcome.error, limit=400)})"
        if outcome.backups:
            line += f"; kept {', '.join(inert_text(b) for b in outcome.backups)}"
        out.append(line + "\n")
    if after is not None:
        out.append("\n" + render_text(after))
    report = after or before
    out.append(f"before: {_counts(before)}; after: {_counts(report)} (fail-on: {report.fail_on})\n")
    out.append(_last_line(outcomes, report, code=code, stage=stage))
    return "".join(out)


def _counts(report: Report) -> str:
    counts = report.counts()
    return f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['note']} note(s)"


def _last_line(outcomes: list[Any], report: Report, *, code: int, stage: bool) -> str:
    """What the fix did and why it exits as it does: the words agree with the exit code (a fixer hook's last line
    said "passed" with an error left and the hook failing because it wrote a file)."""
    done = [o for o in outcomes if o.planned.enabled]
    fixed = sum(1 for o in done if o.ok)
    written = sum(len(o.written) for o in done if o.ok)
    said = [f"{fixed} of {len(done)} fix(es) applied"] if done else ["nothing to fix"]
    if fixed < len(done):
        said.append(f"{len(done) - fixed} not applied (above)")
    if report.failed:
        said.append(f"findings at or above fail-on ({report.fail_on}) remain")
    if stage and written:
        said.append(f"wrote {written} file(s): review and stage them (--exit-non-zero-on-fix)")
    return f"ckpt-guard fix: {'FAILED' if code else 'passed'}: {'; '.join(said)}\n"


def _fix(paths: tuple[Path, ...], **flags: Any) -> int:
    """Plan the mechanical fixes of a scan's findings; --write applies them (default: a dry run)."""
    return run_fix(paths, **flags)


_command: Any = click.argument("paths", nargs=-1, type=click.Path(path_type=Path))(_fix)
for _option in reversed((
    click.option("--write", is_flag=True, help="Apply the plan, verify, and scan again (default: a dry run)."),
    click.option("--select", multiple=True, metavar="CODES", help="Fix only findings with these code prefixes."),
    click.option("--ignore", multiple=True, metavar="CODES", help="Leave findings with these code prefixes."),
    click.option("--to-config", is_flag=True,
                 help="CG103: cast the weights to config.json's dtype instead of rewriting config.json."),
    click.option("--cast", is_flag=True, help="CG101/CG102: write the set in the expected dtype (--expect)."),
    click.option("--allow-lossy", is_flag=True, help="Write a narrowing cast that loses values (reported)."),
    click.option("--unsafe-fixes", is_flag=True,
                 help="Also apply the fixes marked unsafe (CG124: config.json's layer count set to the file's)."),
    click.option("--replace", is_flag=True, help="Allow fixes that replace existing weight files."),
    click.option("--no-backup", is_flag=True, help="Do not keep a replaced file as NAME.orig."),
    click.option("--add", multiple=True, type=click.Choice(ADD_WHATS), help="Add a copy the model lacks."),
    click.option("--values", is_flag=True, help="Also read tensor data (CG107 checksums, CG201-CG204)."),
    click.option("--max-shard-size", default="5GB", show_default=True, help="Largest shard a fix writes."),
    click.option("--verify", type=click.Choice(("sampled", "full")), default="sampled", show_default=True,
                 help="How written weights are read back."),
    click.option("--format", "-f", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True,
                 help="Output format (json: the report, with the plan and outcomes in extra.fix)."),
    click.option("--patch", type=click.Path(dir_okay=False, path_type=Path),
                 help="Write a `git apply`-ready diff of the text files the plan rewrites (dry runs too)."),
    click.option("--changed", type=click.Path(dir_okay=False, path_type=Path),
                 help="After --write, list the files written, one per line."),
    click.option("--exit-non-zero-on-fix", is_flag=True,
                 help="With --write, exit 1 when a fix wrote anything (pre-commit's fixer hook)."),
    *(click_option(flag) for flag in _SCAN_POLICY),
)):
    _command = _option(_command)
fix = click.command("fix", short_help="Plan and apply mechanical fixes of findings.")(_command)
