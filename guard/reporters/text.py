"""--format text: readable on a terminal, colour only when asked (a TTY)."""

from __future__ import annotations

from guard.dtypes import display_name
from guard.findings import Severity
from guard.report import ModelSummary, Report
from guard.reporters.inert import inert_text

_COLORS = {Severity.error: "31", Severity.warning: "33", Severity.note: "36"}
SET_WIDTH = 48
MAX_DTYPE_COLUMNS = 8


def _paint(text: str, code: str, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_count(n: float) -> str:
    for unit in ("", "K", "M", "B"):
        if abs(n) < 1000 or unit == "B":
            return f"{n:.0f}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}B"


def render_text(report: Report, *, color: bool = False) -> str:
    lines: list[str] = []
    if isinstance(report.extra.get("parity"), dict):
        lines.append(parity_summary(report.extra["parity"]))
    flagged = {f.path for f in report.findings}
    for model in report.models:
        lines.extend(_model_lines(model, color, has_findings=_has_findings(model, flagged)))
    for finding in report.sorted_findings():
        where = inert_text(finding.path)
        if finding.line:
            where += f":{finding.line}"
        sev = _paint(finding.severity.value, _COLORS[finding.severity], color)
        lines.append(f"{where}: {finding.code} [{sev}] {inert_text(finding.message, limit=600)}")
    if report.findings:
        lines.append("")
    counts = report.counts()
    conversion = report.extra.get("conversion")
    if isinstance(conversion, dict) and not conversion.get("written"):  # a refusal is not an empty scan
        lines.append(_paint("ckpt-guard: convert refused", "31", color) +
                     f": {counts['error']} error(s), {counts['warning']} warning(s); nothing written to "
                     f"{inert_text(str(conversion.get('output')))}")
        if conversion.get("next_step"):
            lines.append(f"ckpt-guard: what to do: {inert_text(str(conversion['next_step']), limit=600)}")
        return "\n".join(lines) + "\n"
    files = sum(len(m.files) for m in report.models)
    skipped = sum(1 for m in report.models for f in m.files if f.unsupported)
    unreadable = sum(1 for m in report.models for f in m.files if f.format is None) - skipped
    verdict = "FAILED" if report.failed else "passed"
    verdict = _paint(verdict, "31" if report.failed else "32", color)
    not_scanned = f", {skipped} not scanned: unsupported format" if skipped else ""
    hint = fix_hint(report)
    if hint:
        lines.append(f"ckpt-guard: {hint}")
    tally = (f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['note']} note(s) "
             f"(fail-on: {report.fail_on})")
    if not report.models:  # nothing was checked: that, first, and no "passed"
        failed = f"{verdict}: " if report.failed else ""
        lines.append(f"ckpt-guard: {failed}no checkpoint files found; {tally}")
        return "\n".join(lines) + "\n"
    lines.append(
        f"ckpt-guard: {verdict}: {len(report.models)} model(s), {files} file(s) scanned"
        f" ({unreadable} unreadable{not_scanned}); {tally}"
    )
    return "\n".join(lines) + "\n"


def fixable_counts(report: Report) -> tuple[int, int]:
    """(findings a plain ``fix --write`` repairs, findings whose fix waits for a flag)."""
    safe = flagged = 0
    for finding in report.findings:
        if finding.fix is not None and finding.fix.available:
            if finding.fix.safety == "safe":
                safe += 1
            else:
                flagged += 1
    return safe, flagged


def fix_hint(report: Report) -> str | None:
    """One line, or None when no finding has a fix: the same words in text and markdown."""
    safe, flagged = fixable_counts(report)
    if safe:
        more = f"; {flagged} more with flags (`ckpt-guard fix` shows the plan)" if flagged else ""
        return f"{_findings(safe)} can be fixed: `ckpt-guard fix --write`{more}"
    if flagged:
        return f"{_findings(flagged)} can be fixed with flags: `ckpt-guard fix` shows the plan"
    return None


def _findings(n: int) -> str:
    return f"{n} finding" if n == 1 else f"{n} findings"


def _has_findings(model: ModelSummary, flagged: set[str]) -> bool:
    inside = model.path.rstrip("/") + "/"
    return any(f.path in flagged for f in model.files) or any(
        p == model.path or p.startswith(inside) for p in flagged)


def _cell(code: str) -> int:
    """A dtype column's width: 9, wider for a packed label ("nf4 (packed)")."""
    return 9 if len(code) <= 8 else min(len(code), 24) + 1


def _model_lines(model: ModelSummary, color: bool, *, has_findings: bool) -> list[str]:
    """A header, then one row per weight set and one column per dtype (its share of the set)."""
    head = f"{inert_text(model.path)}  ({len(model.files)} file(s)"
    if len(model.sets) > 1:
        head += f", {len(model.sets)} weight sets"
    if model.config_dtype:
        head += f", config dtype {inert_text(model.config_dtype)}"
    if model.quantization is not None:
        head += f", quantized: {inert_text(model.quantization.label, limit=80)}"
        if model.bits_per_weight:
            head += f", {model.bits_per_weight:.2f} bits per weight"
        if model.quantization.note:
            head += f"; {model.quantization.note}"
    lines = [_paint(head + ")", "1", color)]
    sets = model.all_sets
    if not any(ws.dtypes for ws in sets):
        # the pointer to findings only where there are some (CG007 makes one unless it is ignored)
        why = "see the findings below" if has_findings else "its files hold none"
        notes = [f"  {inert_text(ws.name, limit=SET_WIDTH)}: {inert_text('; '.join(ws.notes), limit=300)}"
                 for ws in sets if ws.notes]  # a training set of optimizer state only says what it holds
        first = f"  no tensors read ({why})" if has_findings or not notes else "  no weights: no model tensor"
        return [*lines, first, *notes, ""]
    codes: list[str] = []
    for ws in sorted(sets, key=lambda ws: not ws.primary):
        codes += [code for code in ws.parameter_shares() if code not in codes]
    codes = codes[:MAX_DTYPE_COLUMNS]
    width = max(3, min(max(len(inert_text(ws.name, limit=SET_WIDTH)) for ws in sets), SET_WIDTH)) + 2
    lines.append(f"  {'set':<{width}}{'role':<16}{'format':<13}"
                 + "".join(f"{inert_text(display_name(c), limit=_cell(c) - 1):>{_cell(c)}}" for c in codes)
                 + f"{'parameters':>12}{'bytes':>11}")
    for ws in sets:
        mark = "*" if ws.primary else " "
        shares = ws.parameter_shares()  # quantized: logical counts, the packed payloads as "nf4 (packed)"
        total = sum(shares.values()) or 1
        cells = "".join(f"{shares[c] / total:>{_cell(c)}.1%}" if c in shares else f"{'-':>{_cell(c)}}"
                        for c in codes)
        name = inert_text(ws.name, limit=SET_WIDTH)
        lines.append(f"{mark} {name:<{width}}{inert_text(ws.role, limit=15):<16}{inert_text(ws.format, limit=12):<13}"
                     f"{cells}{human_count(ws.parameters):>12}{human_bytes(ws.bytes):>11}")
    for ws in sets:
        if ws.notes:
            lines.append(f"  {inert_text(ws.name, limit=SET_WIDTH)}: {inert_text('; '.join(ws.notes), limit=300)}")
    if len(sets) > 1:
        lines.append("  (* primary set: the model's parameter and byte counts are its)")
    lines.append("")
    return lines


def parity_summary(figures: dict[str, object]) -> str:
    """Per comparison its rule and worst output; for bf16/fp16, per output both errors and their ratio."""
    from guard.reporters.parity import parity_text

    return parity_text(figures)
