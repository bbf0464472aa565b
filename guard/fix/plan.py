"""The plan: a Report's findings that carry a fix, gated by flags and --select / --ignore.

Rules planned each fix when they raised its finding (STYLE rule 14); here they are only
chosen.  One fix repairs every finding that carries it (two CG103 findings, one rewrite of
config.json).  ``--to-config`` swaps a CG103 finding's config rewrite for its alternative,
the weights cast to the declared dtype, which the rule described in the fix's params.  Fixes
that would write the same file are never both applied: the first in apply order wins.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from guard.findings import Finding
from guard.fix.context import FixOptions
from guard.fixes import ACTIONS, Fix, make_fix
from guard.records import Record
from guard.report import Report
from guard.reporters.inert import inert_text
from guard.reporters.text import human_bytes

# The actions' table is in the order they apply: weights before the files that describe them.
APPLY_ORDER = tuple(ACTIONS)
# The fixes that rewrite values of config.json in place (their byte spans planned by the scan).
CONFIG_ACTIONS = ("config-dtype", "config-field")
# What each flag a fix can wait for turns on.
FLAGS = {"--replace": "replace", "--cast": "cast", "--to-config": "to_config", "--allow-lossy": "allow_lossy",
         "--values": "values", "--unsafe-fixes": "unsafe_fixes"}


class PlannedFix(Record):
    finding: Finding | None  # None for an --add request
    fix: Fix
    enabled: bool  # False: it needs a flag that was not given
    waiting_for: str | None  # the missing flag(s)
    also: tuple[Finding, ...] = ()  # the other findings the same fix repairs
    after: Fix | None = None  # applied only if this fix was (config.json follows the cast of its weights)

    @property
    def findings(self) -> tuple[Finding, ...]:
        return ((self.finding,) if self.finding is not None else ()) + self.also

    def to_json(self) -> dict[str, object]:
        return {"codes": sorted({f.code for f in self.findings}), "paths": sorted({f.path for f in self.findings}),
                "enabled": self.enabled, "waiting_for": self.waiting_for, **self.fix.to_json()}


class FixPlan(Record):
    fixes: list[PlannedFix]  # available fixes, in apply order (one per distinct fix)
    unfixable: list[tuple[Finding, str]]  # findings with no mechanical fix, and why
    not_added: Sequence[tuple[str, str]] = ()  # --add requests refused: (what, why)

    @property
    def fixable(self) -> bool:
        return bool(self.fixes)

    @property
    def enabled(self) -> list[PlannedFix]:
        return [p for p in self.fixes if p.enabled]

    def to_json(self) -> dict[str, object]:
        return {"plan": [p.to_json() for p in self.fixes],
                "unfixable": [{"code": f.code, "path": f.path, "tensor": f.tensor, "reason": why}
                              for f, why in self.unfixable],
                "not_added": [{"request": what, "reason": why} for what, why in self.not_added]}


def selected(code: str, select: tuple[str, ...], ignore: tuple[str, ...]) -> bool:
    """As scan selects: code prefixes, the longest matching prefix wins, everything when none is selected."""
    best_select = max((len(p) for p in select or ("CG",) if code.startswith(p)), default=-1)
    best_ignore = max((len(p) for p in ignore if code.startswith(p)), default=-1)
    return best_select > best_ignore


def plan_fixes(report: Report, options: FixOptions, *, select: tuple[str, ...] = (),
               ignore: tuple[str, ...] = ()) -> FixPlan:
    by_fix: dict[tuple[str, str], PlannedFix] = {}
    unfixable: list[tuple[Finding, str]] = []
    for finding in report.sorted_findings():
        if not selected(finding.code, select, ignore):
            continue
        fix, why = chosen_fix(finding, options)
        if fix is None:
            unfixable.append((finding, why))
            continue
        key = (fix.action, fix.params)
        if key in by_fix:
            by_fix[key] = by_fix[key]._replace(also=(*by_fix[key].also, finding))
            continue
        missing = missing_flags(fix, options)
        by_fix[key] = PlannedFix(finding, fix, not missing, " ".join(missing) or None)
    not_added: list[tuple[str, str]] = []
    for request in report.extra.get("add_requests", []) if options.add else []:
        fix = Fix.from_json(request.get("fix"))
        what = f"{request.get('dir')}: --add {request.get('what')}"
        if fix is None or not fix.available:
            not_added.append((what, fix.description if fix else "nothing planned"))
        elif (fix.action, fix.params) not in by_fix:
            missing = missing_flags(fix, options)
            by_fix[fix.action, fix.params] = PlannedFix(None, fix, not missing, " ".join(missing) or None)
    _config_follows_casts(by_fix)
    ordered = sorted(by_fix.values(), key=lambda p: APPLY_ORDER.index(p.fix.action)
                     if p.fix.action in APPLY_ORDER else len(APPLY_ORDER))
    fixes = _without_conflicts(ordered, unfixable)
    return FixPlan(fixes, unfixable, not_added)


def chosen_fix(finding: Finding, options: FixOptions) -> tuple[Fix | None, str]:
    """The fix this run would apply for ``finding`` (the rule's, or its --to-config alternative), or why none."""
    fix = finding.fix
    if fix is None:
        return None, "no fix was planned for it (a report written before fixes existed: scan again)"
    if not fix.available:
        return None, fix.description
    if fix.action == "safetensors-copy":
        from guard.rules.pickle_only import resharded

        return resharded(fix, options.max_shard_size), ""
    if options.to_config and fix.action == "config-dtype":
        alternative = fix.arguments.get("to_config")
        if not isinstance(alternative, dict):
            return None, ("--to-config: config.json declares no single dtype this set can be cast to (its keys "
                          "disagree, or the set cannot be written again); rewrite config.json instead (drop "
                          "--to-config)")
        return make_fix("set-cast", str(alternative.get("description", "")), safety="needs-flag",
                        flag="--to-config --replace", writes=tuple(alternative.get("writes") or ()),
                        **alternative.get("params", {})), ""
    return fix, ""


def _config_follows_casts(by_fix: dict[tuple[str, str], PlannedFix]) -> None:
    """A cast of the primary set makes config.json declare the new dtype, once the cast is written.

    The model's CG103 rewrite (to the dtype the weights had) gives way: applied after the cast it
    would leave config.json declaring the old dtype over the new weights.  Where config.json does
    not declare the new dtype yet, its rewrite follows the cast (and only if the cast was written).
    """
    for key, cast in list(by_fix.items()):
        args = cast.fix.arguments
        if not (cast.enabled and cast.fix.action == "set-cast" and args.get("primary")):
            continue
        absorbed: tuple[Finding, ...] = ()
        for other_key, other in list(by_fix.items()):
            if other.fix.action == "config-dtype" and other.fix.arguments.get("dir") == args.get("dir"):
                absorbed += other.findings
                del by_fix[other_key]
        config = args.get("config")
        if not isinstance(config, dict):
            by_fix[key] = cast._replace(also=cast.also + absorbed)  # config.json already says the new dtype
            continue
        edits = config.get("edits") or []
        rewrite = make_fix(
            "config-dtype", f"rewrite {', '.join(sorted({str(e['key']) for e in edits}))} in config.json to "
                            f"\"{config.get('value')}\" once {args.get('set')} is cast (only if the cast is written); "
                            "nothing else in the file changes",
            writes=tuple(str(w) for w in config.get("writes") or ()),
            **{k: config[k] for k in ("dir", "file", "value", "edits") if k in config})
        first = absorbed[0] if absorbed else cast.finding
        by_fix[rewrite.action, rewrite.params] = PlannedFix(first, rewrite, True, None, also=absorbed[1:],
                                                            after=cast.fix)


def missing_flags(fix: Fix, options: FixOptions) -> list[str]:
    if fix.safety not in ("needs-flag", "unsafe"):
        return []
    return [flag for flag in (fix.flag or "").split() if not getattr(options, FLAGS.get(flag, ""), False)]


def _without_conflicts(fixes: list[PlannedFix], unfixable: list[tuple[Finding, str]]) -> list[PlannedFix]:
    """The first enabled fix to write a file keeps it; a later one that writes it too is set aside."""
    claimed: dict[str, PlannedFix] = {}
    kept = []
    for planned in fixes:
        clash = next((claimed[w] for w in planned.fix.writes if w in claimed), None) if planned.enabled else None
        if clash is not None:
            why = (f"it would write {', '.join(sorted(set(planned.fix.writes) & set(clash.fix.writes)))} too, "
                   f"which the {clash.fix.action} fix writes; run fix again afterwards")
            unfixable.extend((finding, why) for finding in planned.findings)
            continue
        kept.append(planned)
        if planned.enabled:
            claimed.update((w, planned) for w in planned.fix.writes)
    return kept


def render_plan(plan: FixPlan, *, root: Path = Path(".")) -> str:
    """The dry-run text: per fix the files it writes or rewrites, their sizes, and what changes."""
    lines = []
    for planned in plan.fixes:
        fix = planned.fix
        gate = "safe" if planned.enabled and fix.safety == "safe" else (
            f"with {fix.flag}" if planned.enabled else f"needs {planned.waiting_for}")
        if fix.safety == "unsafe":  # ruff's word: it may change what the model is; never applied unasked
            gate = f"unsafe, {gate}"
        codes = ", ".join(sorted({f.code for f in planned.findings})) or "--add"
        lines.append(f"[{inert_text(gate, limit=60)}] {fix.action} ({codes}): {inert_text(fix.description, limit=600)}")
        lines += [f"    {line}" for line in _file_lines(fix, root)]
        if fix.safety == "unsafe" and not planned.enabled:
            lines.append(f"    not applied without {inert_text(fix.flag or '', limit=60)}: an unsafe fix is shown, "
                         "never applied unasked")
    if plan.unfixable:
        lines += ["", "No mechanical fix:"]
        lines += [f"  {inert_text(f.path)}: {f.code} {inert_text(why, limit=300)}" for f, why in plan.unfixable]
    if plan.not_added:
        lines += ["", "Not added:"]
        lines += [f"  {inert_text(what)}: {inert_text(why, limit=300)}" for what, why in plan.not_added]
    waiting = sum(1 for p in plan.fixes if not p.enabled)
    lines += ["", f"ckpt-guard fix: {len(plan.fixes)} fix(es) planned"
                  + (f", {waiting} waiting for flags" if waiting else "")
                  + f"; {len(plan.unfixable)} finding(s) with no mechanical fix"]
    return "\n".join(lines).lstrip("\n") + "\n"


def _file_lines(fix: Fix, root: Path) -> list[str]:
    args = fix.arguments
    if fix.action in CONFIG_ACTIONS:
        edits = args.get("edits") or []
        delta = sum(len(str(e["new"]).encode()) - int(e["length"]) for e in edits)
        out = []
        for path in fix.writes:
            size = _size(root / path)
            after = f" -> {size + delta:,} bytes" if size is not None else ""
            out.append(f"rewrites {inert_text(path)} ({_shown_size(size)}{after}), only these values:")
        out += [f"  line {e['line']}: {inert_text(str(e['key']), limit=120)}: {inert_text(str(e['old']), limit=80)} "
                f"-> {inert_text(str(e['new']), limit=80)}" for e in edits]
        return out
    out = []
    for path in fix.writes:
        size = _size(root / path)
        verb = "rewrites" if size is not None else "writes"
        out.append(f"{verb} {inert_text(path)}" + (f" (now {_shown_size(size)})" if size is not None else ""))
    estimate = args.get("bytes")
    if isinstance(estimate, int):
        out.append(f"about {human_bytes(estimate)} of tensor data in all, once written")
    return out


def _size(path: Path) -> int | None:
    try:
        return os.stat(path).st_size if path.is_file() else None
    except OSError:
        return None


def _shown_size(size: int | None) -> str:
    return "missing" if size is None else f"{size:,} bytes" if size < 10_000 else human_bytes(size)
