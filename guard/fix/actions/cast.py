"""Casts of one weight set, written through ``guard.write``: one engine, three actions.

set-cast        CG101/CG102 under ``--cast``, CG103 under ``--to-config``: the set in ``to`` (fp32 tensors
                that match ``keep_fp32`` stay fp32), under the same file names (it replaces the set;
                ``guard.fix.apply`` keeps ``NAME.orig``).
variant-recast  CG108: a variant recast to the dtype its name claims, under the same names.
variant-add     CG109: a component's missing dtype variant, cast from its default set and named as
                ``save_pretrained(variant=...)`` names it, one shard per default shard.

Integer and bool tensors, and quantized payloads, are carried unchanged.  A narrowing cast
is value-checked first (``narrowing``) and refused when it would lose values, unless
``--allow-lossy``; widening is exact.  Everything written is read back (``verify_output``
for weights, the scanner's CG004 check for an index).  Sources are safetensors (byte
ranges) or torch ``.bin`` (torch's weights-only loader, after our own header scan); a
``.bin`` set can be cast from but not replaced, as nothing here writes pickles.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from guard import dtypes, jsonload
from guard.config import fp32_keeper
from guard.errors import GuardError
from guard.findings import Finding, Severity, shown
from guard.fix.actions.index import index_text, verify_index, write_text_file
from guard.fix.actions.narrowing import cast_value_findings, refusing
from guard.fix.context import ActionContext, Staged
from guard.fixes import Fix
from guard.inventory import MAX_JSON_BYTES, is_weight_file, scan_local_file
from guard.inventory.names import classify
from guard.progress import tensor_ticks
from guard.rules.variants import SAFETENSORS_STEMS, variant_file_names
from guard.tensors import FileScan, TensorInfo
from guard.write.plan import Loader, Mapped, SourceTensor
from guard.write.verify import verify_output
from guard.write.writer import Naming, OutputTensor, write_output

CAST_TARGETS = ("F32", "F16", "BF16", "F64")


@dataclass  # mutable: the reader appends each shard's tensors to files as it opens them
class SourceSet:
    format: str  # "safetensors" | "torch"
    stem: str
    files: list[tuple[str, list[SourceTensor]]] = field(default_factory=list)  # shard order
    index: str | None = None
    ties: list[dict[str, object]] = field(default_factory=list)  # a pickle's tied names, each kept once


def stage_set_cast(fix: Fix, ctx: ActionContext) -> Staged:
    args = fix.arguments
    names = _set_names(args)
    return _replace_set(ctx, names, to=_target(args), keep_fp32=tuple(str(g) for g in args.get("keep_fp32") or ()),
                        display=str(args.get("dir", ctx.model_dir)), what="set-cast")


def stage_variant_recast(fix: Fix, ctx: ActionContext) -> Staged:
    args = fix.arguments
    names = _set_names(args)
    return _replace_set(ctx, names, to=_target(args), keep_fp32=(), display=str(args.get("dir", ctx.model_dir)),
                        what="variant-recast")


def stage_variant_add(fix: Fix, ctx: ActionContext) -> Staged:
    args = fix.arguments
    display = str(args.get("dir", ctx.model_dir))
    variant, to = str(args["variant"]), _target(args)
    source = open_set(ctx, _names(args, "reads"), display=display)
    written = variant_file_names([name for name, _ in source.files], variant)  # what the rule planned
    if not all(classify(name).variant == variant for name in written):  # a variant is one plain name part
        raise GuardError(f"{display}: {variant!r} is not a variant name")
    for name in written:
        if ctx.final(name).exists() or ctx.final(name).is_symlink():
            raise GuardError(f"{display}/{name} already exists; variant-add only adds files")
    shards = [[_output(t, to, lambda _: False) for t in tensors] for _, tensors in source.files]
    naming = Naming(SAFETENSORS_STEMS[source.stem], ".safetensors", variant)
    if naming.shard_names(len(shards)) + ([naming.index_name] if len(shards) > 1 else []) != written:
        raise AssertionError(f"the writer's names differ from the planned {written}")
    return _cast_and_write(ctx, [(naming, shards)], display=display, source=source, what="variant-add",
                           index=None, summary_names=written)


def open_set(ctx: ActionContext, names: list[str], *, display: str) -> SourceSet:
    """The set's tensors, file by file in shard order, each with the loader that reads it."""
    if not names:
        raise GuardError(f"{display}: the fix names no files to read")
    roles = {name: classify(name) for name in names}
    indexes = [n for n in names if roles[n].kind == "index"]
    weights = sorted((n for n in names if roles[n].kind != "index"), key=lambda n: (roles[n].shard or (0, 0), n))
    formats = {roles[n].format for n in weights}
    if not weights or len(formats) != 1 or len(indexes) > 1:
        raise GuardError(f"{display}: {', '.join(names)} is not one weight set")
    fmt = formats.pop()
    if fmt == "flax":
        raise GuardError(f"{display}: {weights[0]} is Flax msgpack; casting a Flax set is not supported yet "
                         "(convert it with `ckpt-guard convert --to torch` first)")
    if fmt not in ("safetensors", "torch"):
        raise GuardError(f"{display}: {weights[0]}: only safetensors and PyTorch .bin sets can be cast")
    source = SourceSet(fmt, roles[weights[0]].stem, index=indexes[0] if indexes else None)
    if source.index is not None:
        _check_index_covers(ctx, source.index, weights, display=display)
    loader = _loader(fmt)
    for name in weights:
        path = ctx.final(name)
        if not path.is_file():
            raise GuardError(f"{display}/{name}: missing; nothing written")
        scan = scan_local_file(path)
        broken = [f for f in scan.findings if f.severity is Severity.error]
        if broken or scan.format is None:
            raise GuardError(f"{display}/{name}: {broken[0].message if broken else 'unreadable'}; nothing written")
        if scan.metadata.get("format") == "flax":
            raise GuardError(f"{display}/{name}: Flax safetensors are not cast; nothing written")
        infos = list(scan.tensors) if fmt == "safetensors" else _torch_tensors(ctx, path, scan, source)
        for info in infos:
            known = dtypes.DTYPES.get(info.dtype)
            if known is None or known.numpy is None or known.bits < 8:
                raise GuardError(f"{display}/{name}: {shown(info.name)} is {info.dtype}, which cannot be carried "
                                 "yet (sub-byte or unknown dtype); nothing written")
        source.files.append((name, [SourceTensor(info, loader) for info in infos]))
    return source


def _replace_set(ctx: ActionContext, names: list[str], *, to: str, keep_fp32: tuple[str, ...], display: str,
                 what: str) -> Staged:
    source = open_set(ctx, names, display=display)
    if source.format != "safetensors":
        raise GuardError(f"{display}/{source.files[0][0]} is a pickle, and {what} would have to replace it with "
                         "another: add its safetensors copy first (the CG008 fix), then cast that")
    keeps = fp32_keeper(keep_fp32) if keep_fp32 else (lambda _: False)
    units = []
    for name, tensors in source.files:
        stem, _, ext = name.rpartition(".")
        units.append((Naming(stem, "." + ext), [[_output(t, to, keeps) for t in tensors]]))
    return _cast_and_write(ctx, units, display=display, source=source, what=what, index=source.index,
                           summary_names=[name for name, _ in source.files])


def _cast_and_write(ctx: ActionContext, units: list[tuple[Naming, list[list[OutputTensor]]]], *, display: str,
                    source: SourceSet, what: str, index: str | None, summary_names: list[str]) -> Staged:
    """Value checks, then every unit written and read back; ``index``: the set's own index, rewritten
    under its name for the files written under theirs."""
    outputs = [t for _, shards in units for shard in shards for t in shard]

    def where(tensor: SourceTensor) -> str:
        return posixpath.join(display, Path(tensor.info.file).name)

    checks = cast_value_findings(outputs, where=where, allow_lossy=ctx.options.allow_lossy)
    details = _figures(outputs, source)
    if refusing(checks):
        lost = sorted({f.tensor or "" for f in refusing(checks)})
        return Staged(findings=checks, details=details,
                      summary=f"{what} refused: casting would lose values in {len(lost)} tensor(s); nothing written "
                              "(--allow-lossy writes it anyway)")
    full = ctx.options.verify == "full"
    files: list[tuple[Path, Path]] = []
    findings = list(checks)
    for naming, shards in units:
        count = sum(len(shard) for shard in shards)
        written = write_output(ctx.staging, shards, layout="safetensors", naming=naming, checksum=full,
                               ticks=tensor_ticks(f"writing {naming.shard_names(len(shards))[0]}", count))
        verified, _ = verify_output(ctx.staging, [t for shard in shards for t in shard], written,
                                    layout="safetensors", full=full)
        findings += verified + _unreported(written.cast_findings, checks, ctx.options.allow_lossy)
        names = naming.shard_names(len(shards))
        files += [(ctx.staging / n, ctx.final(n)) for n in names]
        if len(shards) > 1:  # the writer wrote the index: check it as a scan would
            staged = ctx.staging / naming.index_name
            findings += verify_index(staged, [ctx.staging / n for n in names],
                                     total_size=sum(t.nbytes for s in shards for t in s))
            files.append((staged, ctx.final(naming.index_name)))
    if index is not None:  # published last: it never names a shard that is not in place yet
        files.append(_rewrite_index(ctx, index, outputs))
        findings += verify_index(files[-1][0], [f for f, _ in files[:-1]], total_size=sum(t.nbytes for t in outputs))
    casts = ", ".join(f"{n:,} {k}" for k, n in details["casts"].items()) or "no tensor changed dtype"  # type: ignore[attr-defined]  # details['casts'] is the kind -> count dict the casts record
    return Staged(files=files, findings=findings, details=details,
                  summary=f"{what}: wrote {', '.join(summary_names[:3])}"
                          f"{f' and {len(summary_names) - 3} more' if len(summary_names) > 3 else ''} ({casts})")


def _rewrite_index(ctx: ActionContext, name: str, outputs: list[OutputTensor]) -> tuple[Path, Path]:
    """The set's own index under its own name: the same weight map, the new total size."""
    original = jsonload.loads(ctx.final(name).read_bytes())
    extra = dict(original.get("metadata") or {})
    extra.pop("total_size", None)
    staged = ctx.staging / name
    write_text_file(staged, index_text(dict(original["weight_map"]), sum(t.nbytes for t in outputs), extra))
    return staged, ctx.final(name)


def _check_index_covers(ctx: ActionContext, index: str, weights: list[str], *, display: str) -> None:
    try:
        weight_map = jsonload.loads(ctx.final(index).read_bytes())["weight_map"]
        shards = set(weight_map.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise GuardError(f"{display}/{index}: not a readable shard index; nothing written") from None
    if shards != set(weights):
        raise GuardError(f"{display}/{index}: names other shards than {', '.join(weights)}; nothing written")


def _output(tensor: SourceTensor, to: str, keeps: Callable[[str], bool]) -> OutputTensor:
    code = tensor.info.dtype
    if dtypes.is_float(code) and code not in dtypes.QUANTIZED_CODES:
        code = "F32" if code in ("F32", "F64") and keeps(tensor.name) else to
    return OutputTensor(Mapped(tensor, (tensor.name,), None), tensor.name, code)


def _unreported(cast_findings: list[Finding], checks: list[Finding], allow_lossy: bool) -> list[Finding]:
    """The writer's own overflow count (CG201) for a tensor the value checks did not already report."""
    seen = {(f.code, f.tensor) for f in checks}
    out = [f for f in cast_findings if (f.code, f.tensor) not in seen]
    return [f._replace(severity=Severity.warning) for f in out] if allow_lossy else out


def _figures(outputs: list[OutputTensor], source: SourceSet) -> dict[str, object]:
    casts: dict[str, int] = {}
    for t in outputs:
        if t.dtype != t.mapped.source.info.dtype:
            key = f"{t.mapped.source.info.dtype}->{t.dtype}"
            casts[key] = casts.get(key, 0) + 1
    read = [name for name, _ in source.files] + ([source.index] if source.index else [])
    return {"from": source.format, "read": read,
            "tensors": len(outputs), "casts": dict(sorted(casts.items())),
            "bytes_out": sum(t.nbytes for t in outputs), "tied": source.ties}


def _set_names(args: dict[str, object]) -> list[str]:
    """The set's weight files and its index: ``files`` and ``index`` where the rule names them, else
    what ``reads`` holds of them (a set-cast also reads config.json, which it does not write)."""
    index = args.get("index")
    names = [*_names(args, "files"), *([index] if isinstance(index, str) else [])]
    if not args.get("files"):
        names = [n for n in _names(args, "reads") if is_weight_file(n) or classify(n).kind == "index"]
    return list(dict.fromkeys(names))


def _names(args: dict[str, object], key: str) -> list[str]:
    value = args.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise GuardError(f"fix parameter {key!r} is not a list of file names")
    return value


def _target(args: dict[str, object]) -> str:
    to = dtypes.parse_dtype_name(str(args.get("to", "")))
    if to not in CAST_TARGETS:
        raise GuardError(f"fix parameter 'to' is {args.get('to')!r}: casts go to fp32, fp16, bf16 or fp64")
    return to


def _loader(fmt: str) -> Loader:
    from guard.convert.read.io_torch import RangeLoader, TorchBinLoader

    return TorchBinLoader() if fmt == "torch" else RangeLoader()


def _torch_tensors(ctx: ActionContext, path: Path, scan: FileScan, source: SourceSet) -> list[TensorInfo]:
    """A pickle's tensors, tied names kept once as save_pretrained keeps them (``guard.fix.tied``); each is
    read through torch's weights-only loader, by name."""
    from guard.fix.tied import settle_shared
    from guard.readers import READ_FAILURES

    infos = scan.tensors
    if scan.format == "torch-zip":  # place the storages, which ties are told by
        from guard.readers.torch.zip import read_torch_zip
        from guard.sources import LocalFile

        try:
            with LocalFile(path, name=scan.path) as file:
                infos = read_torch_zip(file, locate_data=True).tensors
        except (OSError,) + READ_FAILURES as exc:
            raise GuardError(f"{scan.path}: cannot place its tensors ({str(exc)[:200]}); nothing written") from None
    settled = settle_shared(infos, _config(ctx.model_dir))
    source.ties += [tie.to_json() for tie in settled.ties]
    return [t._replace(data_start=None, data_end=None, stride=None) for t in settled.tensors]


def _config(model_dir: Path) -> object:
    try:
        with open(model_dir / "config.json", "rb") as fh:
            return jsonload.loads(fh.read(MAX_JSON_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None
