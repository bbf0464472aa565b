"""safetensors-copy (CG008): a pickled weight set written as safetensors, bit-exactly, without unpickling it.

The scanner's own readers place every tensor in the pickle's file (a stored zip member of
``data/``, or a legacy file's raw storages) without running it.  A contiguous tensor is then
a byte range the writer copies in the kernel (``copy_file_range``); a strided view is gathered
with numpy, one tensor in memory at a time.  Tied names are kept once (``guard.fix.tied``).
Anything that cannot be placed exactly (a deflated member, a big-endian archive, a storage no
plain tensor uses, a refused global) is refused in one line: never a wrong byte.
"""

from __future__ import annotations

import mmap
import os
import posixpath
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from guard import dtypes, jsonload
from guard.errors import GuardError
from guard.findings import shown
from guard.fix.context import ActionContext, Staged
from guard.fix.tied import Settled, settle_shared
from guard.fixes import Fix
from guard.progress import tensor_ticks
from guard.readers import READ_FAILURES, sniff_format
from guard.rules.pickle_only import COPY_STEMS, PICKLE_FORMATS
from guard.sources import LocalFile
from guard.tensors import FileScan, TensorInfo
from guard.write.plan import Mapped, SourceTensor
from guard.write.verify import verify_output
from guard.write.writer import Naming, OutputTensor, plan_shards, write_output

if TYPE_CHECKING:
    import numpy as np

MAX_CONFIG_BYTES = 64 * 2**20
_VARIANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def stage_safetensors_copy(fix: Fix, ctx: ActionContext) -> Staged:
    args = fix.arguments
    stem, variant, files, index = args.get("stem"), args.get("variant"), args.get("files"), args.get("index")
    if stem not in COPY_STEMS.values() or not (variant is None or (isinstance(variant, str)
                                                                   and _VARIANT.fullmatch(variant))):
        raise GuardError(f"{ctx.model_dir}: the safetensors-copy fix names no valid stem or variant")
    if not (isinstance(files, list) and files and all(_plain_name(f) for f in files)
            and (index is None or _plain_name(index))):
        raise GuardError(f"{ctx.model_dir}: the safetensors-copy fix names no files to read")
    tensors = _set_tensors(ctx, files, index)
    settled = settle_shared(tensors, _read_config(ctx.model_dir))
    loader = StridedLoader()
    outputs = [OutputTensor(Mapped(SourceTensor(t, loader), (t.name,), None), t.name, t.dtype)
               for t in settled.tensors]
    shards = plan_shards(outputs, ctx.options.max_shard_size)
    naming = Naming(str(stem), ".safetensors", variant)
    names = naming.shard_names(len(shards)) + ([naming.index_name] if len(shards) > 1 else [])
    for name in names:
        if os.path.lexists(ctx.final(name)):
            raise GuardError(f"{ctx.model_dir / name}: already exists; the safetensors copy would replace it: "
                             "nothing written")
    out = ctx.staging / f"safetensors-copy-{secrets.token_hex(4)}"
    out.mkdir()
    full = ctx.options.verify == "full"
    written = write_output(out, shards, layout="safetensors", naming=naming, checksum=full,
                           ticks=tensor_ticks(f"writing {names[0]}", len(outputs)))
    findings, _ = verify_output(out, outputs, written, layout="safetensors", full=full)
    size = sum(t.nbytes for t in outputs)
    return Staged(
        files=[(out / name, ctx.final(name)) for name in names],
        findings=findings + written.cast_findings,
        summary=_summary(names, len(outputs), size, settled),
        details={"set": args.get("set"), "files": names, "tensors": len(outputs), "bytes": size,
                 "gathered": sum(1 for t in settled.tensors if t.stride is not None),
                 "tied": [tie.to_json() for tie in settled.ties], "tied_names_from": settled.patterns_from,
                 "verification": ctx.options.verify},
    )


def _summary(names: list[str], count: int, size: int, settled: Settled) -> str:
    what = names[0] if len(names) == 1 else f"{names[-1]} and {len(names) - 1} shards"
    line = f"wrote {what}: {count:,} tensors, {size:,} bytes, bit-exact from the pickle (not unpickled)"
    if settled.ties:
        shown_ties = ", ".join(f"{', '.join(shown(d, 80) for d in tie.dropped)} -> {shown(tie.kept, 80)}"
                               for tie in settled.ties[:4])
        more = f" and {len(settled.ties) - 4} more" if len(settled.ties) > 4 else ""
        line += f"; tied names kept once: {shown_ties}{more}"
    return line


def _plain_name(name: object) -> bool:
    """A file directly inside the model directory (params come through JSON reports: never trusted)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _set_tensors(ctx: ActionContext, weights: list[str], index: str | None) -> list[TensorInfo]:
    """Every tensor of the set, placed in its file, in shard order; refused unless all are plain byte spans."""
    tensors: list[TensorInfo] = []
    seen: dict[str, str] = {}
    for name in weights:
        scan = _located_scan(ctx.final(name))
        for info in scan.tensors:
            if info.name in seen:
                raise GuardError(f"{name}: tensor {shown(info.name)} is also in {seen[info.name]}: nothing written")
            seen[info.name] = name
            _check_placed(name, info)
            tensors.append(info)
    if len(weights) > 1 or index is not None:
        _check_index(ctx, index, seen)
    return tensors


def _located_scan(path: Path) -> FileScan:
    name = path.name
    try:
        with LocalFile(path) as source:
            fmt = sniff_format(source)
            if fmt == "torch-zip":
                from guard.readers.torch.zip import read_torch_zip

                scan = read_torch_zip(source, locate_data=True)
                if scan.format == "torch-zip":
                    _check_zip_storages(source, scan)
            elif fmt == "torch-legacy":
                from guard.readers.torch.legacy import read_torch_legacy

                scan = read_torch_legacy(source)
            else:
                raise GuardError(f"{name}: not a torch pickle checkpoint ({fmt or 'unknown format'}): nothing written")
    except OSError as exc:
        raise GuardError(f"{name}: cannot read it ({exc.strerror or exc}): nothing written") from None
    except READ_FAILURES as exc:
        raise GuardError(f"{name}: unreadable ({str(exc).splitlines()[0][:200] if str(exc) else exc!r}): "
                         "nothing written") from None
    if scan.format not in PICKLE_FORMATS:
        raise GuardError(f"{name}: a {scan.format} archive is a program, not a state dict: nothing written")
    if scan.metadata.get("torch_quantized_tensors"):
        raise GuardError(f"{name}: {scan.metadata['torch_quantized_tensors']} torch-quantized tensor(s), whose "
                         "scales and zero points only the pickle holds: a safetensors copy would keep bare "
                         "integers: nothing written")
    for finding in scan.findings:
        if finding.code in ("CG001", "CG003", "CG005"):
            raise GuardError(f"{name}: {finding.message[:200]} ({finding.code}): nothing written")
    if not scan.tensors:
        raise GuardError(f"{name}: holds no tensors: nothing written")
    return scan


def _check_zip_storages(source: LocalFile, scan: FileScan) -> None:
    """Little-endian bytes, and no storage that only something other than a plain tensor uses."""
    from guard.readers.binary.zipdir import read_zip_directory
    from guard.readers.torch.records import find_records, read_record

    entries = read_zip_directory(source)
    prefix = next(iter(entries)).split("/", 1)[0]
    # found as torch finds it (miniz ignores case), as the reader found it: ``archive/BYTEORDER``
    # decides how torch reads the bytes as much as ``archive/byteorder`` does
    order = find_records(entries, (f"{prefix}/byteorder",))[f"{prefix}/byteorder"]
    if order is not None and read_record(source, order, limit=16) != b"little":
        raise GuardError(f"{Path(source.name).name}: its storages are big-endian: nothing written "
                         "(load and re-save it with torch on a little-endian machine)")
    stored = {name[len(prefix) + 6:] for name in entries if name.startswith(f"{prefix}/data/")}
    unused = stored - {t.storage for t in scan.tensors if t.storage is not None}
    if unused:
        raise GuardError(f"{Path(source.name).name}: {len(unused)} storage(s) hold bytes no plain tensor uses "
                         "(a sparse, quantized or subclass tensor?): a copy would lose them: nothing written")


def _check_placed(name: str, info: TensorInfo) -> None:
    known = dtypes.DTYPES.get(info.dtype)
    if known is None or known.numpy is None or known.bits < 8:
        raise GuardError(f"{name}: tensor {shown(info.name)} is {info.dtype}, which safetensors copies cannot "
                         "carry here: nothing written")
    if info.data_start is None or info.data_end is None:
        raise GuardError(f"{name}: tensor {shown(info.name)} is not stored as a plain byte range (a compressed "
                         "zip member, or a tensor without storage): nothing written")


def _check_index(ctx: ActionContext, index: str | None, seen: dict[str, str]) -> None:
    if index is None:
        raise GuardError(f"{ctx.model_dir}: the shards stand without their index: nothing written")
    try:
        weight_map = jsonload.loads(ctx.final(index).read_bytes())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GuardError(f"{index}: not a readable shard index ({type(exc).__name__}): nothing written") from None
    if not isinstance(weight_map, dict) or weight_map != seen:
        raise GuardError(f"{index}: its weight_map disagrees with the shards on disk (CG004): nothing written")


def _read_config(model_dir: Path) -> object:
    path = model_dir / "config.json"
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        return jsonload.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


class StridedLoader:
    """A strided view gathered from the span it covers: the span is mapped, the elements copied out once."""

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        from guard.write.bitviews import numpy_dtype

        assert info.data_start is not None and info.data_end is not None and info.stride is not None
        dtype = numpy_dtype(info.dtype)
        size = info.data_end - info.data_start
        if not size:
            return np.empty(info.shape, dtype)
        with open(info.file, "rb", buffering=0) as fh:
            if os.fstat(fh.fileno()).st_size < info.data_end:
                raise GuardError(f"{posixpath.basename(info.file)}: {shown(info.name)} is truncated: nothing written")
            skip = info.data_start % mmap.ALLOCATIONGRANULARITY
            mapping = mmap.mmap(fh.fileno(), size + skip, prot=mmap.PROT_READ, offset=info.data_start - skip)
        try:
            span = np.frombuffer(mapping, np.uint8, size, skip).view(dtype)
            view = np.lib.stride_tricks.as_strided(span, info.shape, [s * dtype.itemsize for s in info.stride],
                                                   writeable=False)
            gathered = np.ascontiguousarray(view)
            del span, view
        finally:
            mapping.close()
        return gathered
