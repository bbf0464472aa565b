"""`ckpt-guard convert SRC --to maxtext --out OUT [--scan-layers]`, and `convert OUT --to torch` back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from guard.errors import UsageError

if TYPE_CHECKING:
    from guard.cli.convert import ConvertOptions, OwnLayout, Writer


def is_maxtext_source(src: Path) -> bool:
    from guard.convert.maxtext.ocdbt import find_items, is_maxtext_tree

    items = find_items(src) if src.is_dir() else None
    return items is not None and is_maxtext_tree(items)  # another OCDBT Orbax tree is convert's own source


def write(options: ConvertOptions) -> int:
    """The maxtext row's writer (guard.targets.table), and its way back: --to torch from a MaxText checkpoint."""
    from guard.cli.convert import _summaries, next_step, parse_size

    return convert_maxtext(options.src, options.to, options.out, dtype=options.dtype, keep_fp32=options.keep_fp32,
                           scan_layers=options.scan_layers, allow_lossy=options.allow_lossy,
                           run_parity=options.run_parity, max_shard_size=parse_size(options.max_shard_size),
                           fmt=options.fmt, output=options.output, summaries=_summaries, next_step=next_step)


if TYPE_CHECKING:  # the maxtext row's writer, back_writer and own_layout meet convert's protocols: mypy checks it
    _WRITER: Writer = write
    _OWN_LAYOUT: OwnLayout = is_maxtext_source


def convert_maxtext(src: Path, to: str, out: Path, *, dtype: str, keep_fp32: tuple[str, ...], scan_layers: bool,
                    allow_lossy: bool, run_parity: bool, max_shard_size: int, fmt: str, output: Path | None,
                    summaries: Callable[[Path], list[Any]], next_step: Callable[[list[Any]], str]) -> int:
    """``summaries`` and ``next_step`` are guard.cli.convert's own (passed in: that module imports this one)."""
    from guard.cli.options import emit
    from guard.report import Report

    if run_parity:
        parity_requirements(to, dtype)
    if to == "maxtext":
        from guard.convert.maxtext.run import MaxTextRequest, convert_to_maxtext
        from guard.write.cast import DTYPE_CHOICES, CastPolicy

        request = MaxTextRequest(src, out, scan_layers, CastPolicy(DTYPE_CHOICES[dtype], tuple(keep_fp32)),
                                 allow_lossy)
        findings, figures = convert_to_maxtext(request)
    else:
        from guard.convert.maxtext.back import convert_from_maxtext
        from guard.convert.maxtext.ocdbt import find_items

        if dtype != "keep" or scan_layers:
            raise UsageError("converting a MaxText checkpoint back writes its stored dtypes; drop --dtype and "
                             "--scan-layers")
        items = find_items(src)
        assert items is not None
        findings, figures = convert_from_maxtext(items, out, max_shard_size=max_shard_size)
    if not figures.get("written"):
        figures["next_step"] = next_step(findings)
    report = Report(findings=findings, policy={"fail_on": "error"}, extra={"conversion": figures})
    if run_parity and figures.get("written"):
        from guard.against.run import run_against

        parity_findings, report.extra["parity"] = run_against(src, "maxtext", converted=Path(figures["items"]))
        report.findings.extend(parity_findings)
    if figures.get("written"):
        report.models.extend(summaries(out))  # the scanner's own reading of what was written
    from guard.quiet import report_stdout  # the report's stdout: a library's print goes elsewhere

    if fmt == "text" and output is None and figures.get("written"):
        for line in summary_lines(figures):
            click.echo(line, file=report_stdout())
    emit(report, fmt, output)
    return report.exit_code


def parity_requirements(to: str, dtype: str) -> None:
    """What ``--parity`` needs, known before anything is written: one line, and no output.  It runs MaxText's own
    forward on the written checkpoint, in MaxText's environment (Python >= 3.12), against transformers' PyTorch
    forward of the source (``guard.against.run``, the worker of ``parity --against maxtext``)."""
    from guard.against.run import environment_python
    from guard.against.targets import TARGETS

    if to != "maxtext":
        raise UsageError("--parity runs MaxText's forward on a checkpoint written --to maxtext; for the way back, "
                         "run `ckpt-guard parity OUT --against maxtext` on the result; nothing written")
    if dtype != "keep":
        raise UsageError("--parity compares MaxText's checkpoint with the source file bit for bit; convert without "
                         "--dtype (MaxText's weight_dtype casts at load), or check the cast output with `ckpt-guard "
                         "parity` after converting it back; nothing written")
    try:
        environment_python(TARGETS["maxtext"], None)
    except UsageError as exc:
        raise UsageError(f"--parity: {exc}; nothing written") from None


def summary_lines(figures: dict) -> list[str]:
    from guard.reporters.inert import inert_text

    if figures.get("to") == "torch":
        return [inert_text(f"ckpt-guard: converted {figures['source']} (MaxText, {figures['architecture']}) -> "
                           f"{figures['output']} (safetensors, {figures['tensors_out']} tensors, "
                           f"{figures['shards_out']} shard(s)); verified {figures['verified']} tensors", limit=600)]
    lines = [inert_text(f"ckpt-guard: converted {figures['source']} ({figures['from']}, "
                        f"{figures['tensors_in']} tensors) -> {figures['items']} (MaxText {figures['model_name']} "
                        f"layout, {figures['leaves']} leaves, "
                        f"scan_layers={str(figures['scan_layers']).lower()}) in {figures['seconds']:.1f}s", limit=600)]
    for param, counts in figures.get("declared_roundings", {}).items():
        lines.append(inert_text(f"  declared rounding: {param}: {counts['changed']} of {counts['elements']} "
                                "elements change (a rounding step of MaxText's layout); all else bit-exact", limit=600))
    lines.append("  MaxText flags (MaxText takes sizes from model_name's table, not from the checkpoint):")
    lines.append(inert_text("    " + " ".join(figures["maxtext_flags"]), limit=4000))
    lines.extend(inert_text(f"  note: {note}", limit=600) for note in figures.get("maxtext_notes", []))
    return lines
