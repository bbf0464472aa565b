"""`ckpt-guard convert SRC --to TARGET --out DIR`: bit-exact by default, every cast explicit.

``--to`` is dispatched through the table of targets alone (``guard.targets.table``): the command gathers its
flags into one ``ConvertOptions`` and calls the target row's ``writer``, or, for a SRC in a target's own
layout, that row's ``back_writer``.  No target is named here: a new one is a row (tests/test_targets.py).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import click

from guard.errors import GuardError, MissingExtraError, UsageError
from guard.lazy import resolve
from guard.records import Record
from guard.reporters import REPORTERS
from guard.targets import TARGETS, to_choices, to_help

CONVERT_MODULES = ("numpy", "ml_dtypes", "msgpack", "torch", "jax", "flax")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """transformers' convention: 5GB = 5 * 10**9 bytes, 5GiB = 5 * 2**30; a bare number is bytes."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"--max-shard-size {text!r}: expected a size such as 5GB, 500MB or 2GiB")
    number, unit = float(match.group(1)), match.group(2).upper()
    scale = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}.get(unit)
    if scale is None or number * scale < 1:
        raise UsageError(f"--max-shard-size {text!r}: expected a size such as 5GB, 500MB or 2GiB")
    return int(number * scale)


def require_extras(modules: tuple[str, ...], extra: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, extra)


class ConvertOptions(Record):
    """Every flag of `convert`, as a writer receives them (a row's ``writer``: ``(ConvertOptions) -> int``)."""
    src: Path
    to: str
    out: Path
    dtype: str = "keep"
    keep_fp32: tuple[str, ...] = ()
    layout: str | None = None
    variant: str | None = None
    max_shard_size: str = "5GB"
    allow_lossy: bool = False
    verify: str = "sampled"
    dequantize: bool = False
    run_parity: bool = False
    flax_python: Path | None = None
    scan_layers: bool = False
    config: Path | None = None
    strict: bool = False
    fmt: str = "text"
    output: Path | None = None


class TableChoice(click.Choice):
    """A click.Choice read from the table when click checks a value: a row added is a choice, with no edit here."""

    def __init__(self, rows: Callable[[], tuple[str, ...]]) -> None:
        self._rows = rows
        super().__init__(rows())

    @property  # type: ignore[override]  # click stores a tuple; this reads the table each time
    def choices(self) -> Sequence[str]:
        return self._rows()

    @choices.setter
    def choices(self, value: Sequence[Any]) -> None:  # click's __init__ assigns the tuple it was given
        pass


class Writer(Protocol):
    """What a target row's ``writer`` and ``back_writer`` name (``write_hf_layout``, ``convert_maxtext.write``):
    convert's options in, the exit code out.  tests/test_architecture.py resolves every row's and checks it."""

    def __call__(self, options: ConvertOptions, /) -> int: ...


class OwnLayout(Protocol):
    """What a target row's ``own_layout`` names (``convert_maxtext.is_maxtext_source``): is SRC in its layout."""

    def __call__(self, src: Path, /) -> bool: ...


def writer_of(options: ConvertOptions) -> Writer:
    """The row's writer for ``--to``; for a SRC in a target's own layout (a MaxText checkpoint), the way back
    that row declares for this ``--to``."""
    for row in TARGETS.values():
        if row.back_writer and row.back_to == options.to:
            in_own_layout: OwnLayout = resolve(row.own_layout)
            if in_own_layout(options.src):
                back: Writer = resolve(row.back_writer)
                return back
    writer: Writer = resolve(TARGETS[options.to].writer)
    return writer


@click.command(short_help="Convert between PyTorch and Flax, bit-exactly.")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--to", "to", type=TableChoice(to_choices), required=True, help=to_help())
@click.option("--out", "out", type=click.Path(path_type=Path), required=True,
              help="New output directory (must not exist, or be empty; never SRC).")
@click.option("--dtype", "dtype", type=click.Choice(["keep", "fp32", "bf16", "fp16"]), default="keep",
              show_default=True, help="Cast floating tensors; keep is bit-exact.")
@click.option("--keep-fp32", "keep_fp32", multiple=True, metavar="PATTERN",
              help="Tensor-name glob held in fp32 whatever --dtype says (repeatable), e.g. '*norm*'.")
@click.option("--layout", type=click.Choice(["msgpack", "orbax"]), default=None,
              help="With --to flax: flax_model.msgpack (default, transformers' layout) or an Orbax checkpoint.")
@click.option("--variant", metavar="NAME",
              help="Read the NAME variant (model.NAME.safetensors, ...) instead of the default weights.")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest output shard.")
@click.option("--allow-lossy", is_flag=True, help="Write even when a cast overflows (CG201 becomes a warning).")
@click.option("--verify", "verify", type=click.Choice(["sampled", "full"]), default="sampled", show_default=True,
              help="Read-back check: headers, placements and sampled elements against the source; full adds "
                   "a CRC32 of every byte.")
@click.option("--dequantize", is_flag=True,
              help="Write a quantized model (bitsandbytes, GPTQ, AWQ, HQQ, quanto, FP8, MLX, ...) in full precision, "
                   "at --dtype (keep: the config's dtype).")
@click.option("--parity", "run_parity", is_flag=True, help="Then compare PyTorch and Flax outputs (CG302/CG303).")
@click.option("--flax-python", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --parity: the Python of a transformers-4 environment to run the Flax side in (default: "
                   "$CKPT_GUARD_FLAX_PYTHON, else this process when its transformers is 4.x, else the environment "
                   "`ckpt-guard env install tf4` builds).")
@click.option("--scan-layers", is_flag=True,
              help="With --to maxtext: one decoder/layers subtree stacked on MaxText's param_scan_axis "
                   "(scan_layers=true).")
@click.option("--config", "config", type=click.Path(path_type=Path), default=None,
              help="A training checkpoint's model config: a config.json, or the folder holding it (default: beside "
                   "the checkpoint, or in its parent folder).")
@click.option("--strict", is_flag=True,
              help="Refuse, instead of dropping with a warning, tensors the target class has no place for.")
@click.option("--verbose", "-v", is_flag=True, help="Show the libraries' own warnings and log lines.")
@click.option("--format", "-f", "fmt", type=click.Choice(tuple(REPORTERS)), default="text", show_default=True,
              help="Output format.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report to FILE instead of stdout.")
def convert(src: Path, to: str, out: Path, dtype: str, keep_fp32: tuple[str, ...], layout: str | None,
            variant: str | None, max_shard_size: str, allow_lossy: bool, verify: str, dequantize: bool,
            run_parity: bool, strict: bool, verbose: bool, fmt: str, output: Path | None,
            scan_layers: bool = False, config: Path | None = None, flax_python: Path | None = None) -> int:
    """Convert a model directory between PyTorch and Flax, bit-exactly unless --dtype says otherwise."""
    require_extras(CONVERT_MODULES, "convert")
    from guard.quiet import quiet_libraries

    options = ConvertOptions(src, to, out, dtype=dtype, keep_fp32=tuple(keep_fp32), layout=layout, variant=variant,
                             max_shard_size=max_shard_size, allow_lossy=allow_lossy, verify=verify,
                             dequantize=dequantize, run_parity=run_parity, flax_python=flax_python,
                             scan_layers=scan_layers, config=config, strict=strict, fmt=fmt, output=output)
    with quiet_libraries(verbose=verbose):
        return writer_of(options)(options)


def write_hf_layout(options: ConvertOptions) -> int:
    """The flax and torch rows' writer: transformers' layouts (flax_model.msgpack or Orbax, safetensors)."""
    from guard.cli.options import emit
    from guard.convert.read.io_orbax import is_orbax_checkpoint
    from guard.convert.run import output_layout

    src, to, out, run_parity, layout = options.src, options.to, options.out, options.run_parity, options.layout
    output_layout(to, layout)  # a layout the target has not is the first thing to say
    if run_parity and (layout == "orbax" or is_orbax_checkpoint(src)):
        raise UsageError("--parity loads flax_model.msgpack with transformers; it cannot read an Orbax checkpoint "
                         "(convert with --layout msgpack for parity)")
    flax_side = None
    if run_parity:  # where the Flax side runs (this process or a transformers-4 environment), before writing
        flax_side = parity_requirements(src, to, variant=options.variant, dequantize=options.dequantize,
                                        flax_python=options.flax_python)
    from guard.convert.run import ConvertRequest, convert_model
    from guard.report import Report
    from guard.write.cast import DTYPE_CHOICES, CastPolicy

    request = ConvertRequest(src, out, to, CastPolicy(DTYPE_CHOICES[options.dtype], options.keep_fp32),
                             parse_size(options.max_shard_size), options.allow_lossy, options.strict, layout=layout,
                             verify=options.verify, variant=options.variant, dequantize=options.dequantize,
                             config=options.config)
    findings, figures = convert_model(request)
    if not figures.get("written"):
        figures["next_step"] = figures.get("next_step") or next_step(findings)
    report = Report(findings=findings, policy={"fail_on": "error"}, extra={"conversion": figures})
    if figures.get("written"):
        report.models.extend(_summaries(out))
        if run_parity:
            try:
                _add_parity(report, request, figures, flax_side)
            except GuardError:  # a parity asked for that could not run is exit 2, and leaves no output
                import shutil

                shutil.rmtree(out, ignore_errors=True)
                raise
    fmt, output = options.fmt, options.output
    from guard.quiet import report_stdout  # the report's stdout: a library's print goes elsewhere

    if fmt == "text" and output is None and figures.get("written"):  # a refusal ends the report instead
        click.echo(conversion_line(figures), file=report_stdout())
        for line in decision_lines(figures):
            click.echo(line, file=report_stdout())
    emit(report, fmt, output)
    return report.exit_code


_HF_WRITER: Writer = write_hf_layout  # the flax and torch rows' writer meets the protocol: mypy checks it


def parity_requirements(src: Path, to: str, *, variant: str | None, dequantize: bool,
                        flax_python: Path | None = None) -> Any:
    """Everything --parity needs, known before the first byte is written: one line, and no output.
    Returns where the Flax side runs (a ``guard.envs.find.Found``: this process or a transformers-4 Python)."""
    from guard.convert.read.source import choose_layout
    from guard.parity.needs import flax_side

    if not dequantize and src.is_dir():  # a quantized source has no twin: its output is paired with itself
        if choose_layout(src, to=to, variant=variant)[0] == to:  # an Orbax SRC was refused above
            raise UsageError("--parity compares a PyTorch and a Flax model; source and target are the same "
                             "framework; nothing written")
    return flax_side(flax_python, "--parity", after="; nothing written")


def _summaries(out: Path) -> list:
    from guard.inventory import discover_models, load_local_model
    from guard.report import ModelSummary

    return [ModelSummary.from_inventory(load_local_model(m)) for m in discover_models([out])]


def _add_parity(report, request, figures, flax_side) -> None:
    """Compare like with like: after a cast, or from a variant (which transformers would not pick up from SRC
    unasked), the other side is the output converted back bit-exactly.  ``flax_side``: where the Flax side
    runs, recorded in the report as ``--against``'s environment is (a version outside the checked set too)."""
    import tempfile

    dequantized = bool(figures.get("dequantized"))  # the quantized source has no twin: pair the output with itself
    from guard.convert.run import ConvertRequest, convert_model
    from guard.parity.run import run_parity
    from guard.write.cast import CastPolicy

    with tempfile.TemporaryDirectory(prefix="ckpt-guard-parity-") as scratch:
        pair = request.src
        if figures.get("casts") or request.variant or dequantized:
            pair = Path(scratch) / "pair"
            back = ConvertRequest(request.out, pair, "torch" if request.to == "flax" else "flax", CastPolicy(None),
                                  request.max_shard_size)
            findings, _ = convert_model(back)
            report.findings.extend(findings)
            if not pair.is_dir():
                return
        torch_dir, flax_dir = (pair, request.out) if request.to == "flax" else (request.out, pair)
        flax_python = None if flax_side.in_process else flax_side.python
        findings, parity_figures = run_parity(torch_dir, flax_dir, flax_python=flax_python)
    report.findings.extend(findings)
    parity_figures["environment"] = flax_side.figures()
    if pair != request.src:  # name what was compared, not a scratch directory that is gone
        side = "torch_dir" if request.to == "flax" else "flax_dir"
        parity_figures[side] = f"{request.out} (converted back, bit-exact)"
    report.extra["parity"] = {**parity_figures, "paired_with": "source" if pair == request.src else
                              "the output converted back with --dtype keep (the casts applied on both sides)"}


NEXT_STEPS = {  # the first error's code -> what the user can do about it
    "CG001": "repair or re-download the file named above; convert reads only intact files",
    "CG003": "the pickle is refused unread; convert from model.safetensors instead (or re-save it as safetensors)",
    "CG004": "the shard index and the shards disagree: restore the missing shard or fix the index",
    "CG201": "choose a wider --dtype, hold the tensors in fp32 with --keep-fp32, or write anyway with --allow-lossy",
    "CG110": "a quantized module lacks a part it needs (a scale, zeros, its quant_state): re-download or re-quantize "
             "the model; --dequantize reads only complete modules",
    "CG111": "the packed tensors disagree with the bits, group size or shape declared: check quantization_config "
             "against the files, or re-download them",
    "CG112": "the tensors are not packed the way quantization_config says: check its quant_method and format",
    "CG205": "a scale is NaN, infinite or zero where the method forbids it: the weights it scales are lost; "
             "re-download or re-quantize the model",
    "CG301": "the written output did not read back: check the disk, then report it as a bug",
    "CG304": "the tensors do not fit the architecture config.json names: check its model_type and architectures; "
             "a tensor the target class has no place for is dropped with a warning unless --strict",
}


def next_step(findings: list) -> str:
    errors = [f.code for f in findings if f.severity.value == "error"]
    return NEXT_STEPS.get(errors[0], "fix the findings above and run convert again") if errors else ""


def decision_lines(figures: dict) -> list[str]:
    """"dropped 2 buffer(s) the FlaxBertModel class does not hold: embeddings.position_ids, ..."."""
    from guard.reporters.inert import inert_text

    lines = []
    for d in figures.get("decisions", []):
        verb = {"tied": "left out", "restored": "restored", "restored_table": "restored"}.get(d["kind"], "dropped")
        shown = ", ".join(d["tensors"][:6]) + (f", ... ({len(d['tensors']) - 6} more)" if len(d["tensors"]) > 6 else "")
        lines.append(inert_text(f"  {verb} {d['count']} {d['reason']}: {shown}", limit=600))
    return lines


def conversion_line(figures: dict) -> str:
    if not figures.get("written"):
        return f"ckpt-guard: convert: refused, nothing written to {figures['output']}"
    casts = ", ".join(f"{k} x{n}" for k, n in figures.get("casts", {}).items()) or "none (bit-exact)"
    variant = f"variant {figures['variant']}, " if figures.get("variant") else ""
    if figures.get("dequantized"):  # "bitsandbytes nf4 4-bit, 14 modules dequantized, "
        variant += f"{figures['dequantized']['label']}, {figures['dequantized']['modules']} modules dequantized, "
    return (f"ckpt-guard: converted {figures['source']} ({figures['from']}, {variant}{figures['tensors_in']} tensors, "
            f"{figures['shards_in']} file(s)) -> {figures['output']} ({figures['to']}, {figures['tensors_out']} "
            f"tensors, {figures['shards_out']} shard(s)); mapping: {figures.get('mapping')} "
            f"({figures.get('architecture') or 'same framework'}); casts: {casts}; "
            f"tied: {len(figures.get('tied', []))}, dropped: {len(figures.get('dropped', []))}; "
            f"verified {figures.get('verified', 0)} tensors in {figures.get('seconds', 0):.1f}s")
