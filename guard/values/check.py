"""Value checks (``scan --values``): CG201-CG204 from tensor data, read in bounded chunks.

Which checks fire:
- CG203 (NaN/Inf) always, on every floating tensor.
- CG201 / CG202 (overflow / underflow) and CG204 (rounding) for each cast that is
  *in play*: a ``--target framework:DTYPE`` narrower than the tensor, plus fp16
  when ``--expect fp16``.  Without one, nothing is being cast, so nothing can
  overflow; the fp16 overflow figure is still computed and lands in the report's
  ``extra["values"]`` (it costs nothing unless values reach 65504), its underflow
  counts are null: they cost a gather of the tiny values in every chunk of real
  weights, for a figure no rule read (issue 47).
- CG207 (dead weights): matrices that are all zero or one constant (``guard.values.dead``).
- CG107 (copies disagree) for copies whose headers agree but whose values do not
  (``guard.values.copies``: a checksum per tensor, names paired by convert's mapping).
- CG204 is one note per file and target (the worst tensor named): every tensor
  of an fp32 model rounds under bf16, and one note per tensor would bury the rest.
  The per-tensor figures are in ``extra["values"]``.

Reading: ``os.preadv`` into one reused, page-aligned 1 MiB buffer per worker thread, examined 256 KiB
at a time, rather than mapping the file: the same bounded memory, the chunk and its work arrays stay in
the CPU cache across the few passes over it (16 MiB chunks ran at half the
speed), and a file that shrinks while it is read gives a short read (a CG001
finding) instead of SIGBUS killing the process.
"""

from __future__ import annotations

import importlib.util
import mmap
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.errors import MissingExtraError
from guard.findings import Finding
from guard.inventory import ModelInventory
from guard.progress import ByteProgress
from guard.records import Record
from guard.tensors import TensorInfo
from guard.values.located import located_tensors

# small enough that a chunk, its magnitudes and its flags (2.5x the chunk) stay in a core's L2 cache
# across the passes over them: 256 KiB scanned bf16 15 % faster than 1 MiB, 64 KiB paid the calls
CHUNK_BYTES = 256 * 1024
# Read four chunks at a time: a quarter of the preadv calls, the same passes over cache-sized chunks.  On
# a 13-CPU gVisor host a 1.48 GB bf16 scan took 0.89-1.04 s where one call per chunk took 1.14-1.25 s;
# here (2 CPUs) the CPU time is the same or less.  Whole 1 MiB chunks were faster there still (0.70-0.78 s)
# but cost 10-15 % more CPU time here: the chunk stays 256 KiB.
READ_BYTES = 1024 * 1024
# Two, not four: a chunk is a few numpy calls, each a GIL handoff between the workers.  On a 13-CPU host
# (gVisor, where a futex costs a system call) a 15 GB bf16 scan took 6.3-7.6 s on one thread, 9.4 s on two
# and 16.8 s on four (36 s of CPU time); on two CPUs, two threads beat one (docs/benchmarks.md, issue 47).
WORKERS = min(2, os.cpu_count() or 1)  # peak memory: a few MiB per worker
FP16_MAX, FP16_TINY = "65504", "2^-14"


class ValueResults(Record):
    findings: list[Finding]
    stats: list[dict[str, Any]]  # per-tensor figures, carried in the JSON report's extra["values"]


def value_findings(inv: ModelInventory, policy: Policy) -> ValueResults:
    require_extras()
    from guard.values.stats import CAST_TARGETS

    requested = tuple(dict.fromkeys(t.dtype for t in policy.targets if t.dtype in CAST_TARGETS))
    in_play = requested + (("F16",) if policy.expect == "F16" and "F16" not in requested else ())
    labels = {t.dtype: str(t) for t in policy.targets if t.dtype}
    labels.setdefault("F16", "--expect fp16")
    from guard.values.quantized import packed_under_float  # bnb 4-bit bytes stored as bf16/f32: not values

    packed = packed_under_float(inv)
    checked = [t for t in located_tensors(inv) if (dtypes.is_float(t.dtype) or t.dtype == "C64")
               and (t.file, t.name) not in packed]
    findings: list[Finding] = []
    stats: list[dict[str, Any]] = []
    rounding: dict[tuple[str, str], list[tuple[float, float | None, str, int]]] = {}
    with _Files() as files:
        skips = [_skip_reason(info, files) for info in checked]
        # Tied weights and views share bytes: each range is read once.
        jobs = list(dict.fromkeys(_key(info) for info, skip in zip(checked, skips) if skip is None))
        total = sum(end - start for _file, start, end, _dtype in jobs)
        with ByteProgress(total, desc=f"values {inv.path}") as bar:

            def scan(key: tuple[str, int, int, str]) -> Any:
                try:
                    return _scan_range(key, files, ranges=("F16",) + in_play, rounding=requested,
                                       underflow=in_play, bar=bar)
                except _Truncated as exc:
                    return exc

            # numpy and preadv release the GIL: ranges are scanned on a few threads.
            with ThreadPoolExecutor(max_workers=WORKERS) as pool:
                results = dict(zip(jobs, pool.map(scan, jobs)))
    for info, skip in zip(checked, skips):
        if skip is not None:
            stats.append({**_where(info), "skipped": skip})
            continue
        result = results[_key(info)]
        if isinstance(result, _Truncated):
            findings.append(make_finding("CG001", info.file, str(result), tensor=info.name))
            stats.append({**_where(info), "skipped": str(result)})
            continue
        stats.append({**_where(info), **_figures(result), "numel": info.numel})
        findings.extend(_tensor_findings(info, result, in_play, labels))
        for code, cast in result.casts.items():
            if code in requested and cast.rounded:
                rounding.setdefault((info.file, code), []).append(
                    (cast.max_rel_error, cast.worst_rel_value, info.name, cast.rounded))
    for (path, code), rows in rounding.items():
        err, value, name, _count = max(rows, key=lambda r: r[0])
        findings.append(make_finding(
            "CG204", path,
            f"casting to {dtypes.display_name(code)} ({labels[code]}) rounds {sum(r[3] for r in rows):,} values "
            f"in {len(rows)} tensor(s); max relative error {err:.3g} in {name!r} (value {value:.9g})",
            tensor=name))
    from guard.values.dead import dead_weight_findings  # CG207: matrices of one value, grouped

    findings.extend(dead_weight_findings(inv))
    from guard.values.copies import copy_value_findings  # CG107: copies that agree on headers, by value

    findings.extend(copy_value_findings(inv, policy))
    from guard.values.quantized import quantized_value_findings  # CG205/CG206: scales, saturated FP8

    findings.extend(quantized_value_findings(inv))
    return ValueResults(findings, stats)


def require_extras() -> None:
    if "numpy" not in sys.modules:
        # numpy starts OpenBLAS's worker threads on import, a third of its import's CPU time on two
        # cores; a value scan multiplies no matrices.  A user's own setting wins.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise MissingExtraError("numpy", "values") from None
    # The extra's other half, asked for but not imported: bf16 and fp8 are read from their bits
    # (guard.values.minifloats), and importing ml_dtypes 0.7 costs more than scanning 1.5 GB.
    if importlib.util.find_spec("ml_dtypes") is None:
        raise MissingExtraError("ml_dtypes", "values")


def _is_checked(code: str) -> bool:
    from guard.values.stats import IEEE_BITS, WIDENED_TO_F32

    return code in IEEE_BITS or code in WIDENED_TO_F32 or code == "C64"


def _where(info: TensorInfo) -> dict[str, Any]:
    return {"file": info.file, "tensor": info.name, "dtype": info.dtype, "shape": list(info.shape)}


def _skip_reason(info: TensorInfo, files: _Files) -> str | None:
    if not _is_checked(info.dtype):
        return f"{info.dtype} cannot hold NaN or Inf; not checked"
    if info.data_start is None or info.data_end is None:
        return "the reader did not locate this tensor's bytes (chunked or pickled storage); not checked"
    span, need = info.data_end - info.data_start, info.nbytes or 0
    if info.stride is not None and span != need:
        return "a strided view over part of its storage; not checked"
    if span != need:
        return f"byte range of {span:,} bytes does not match {need:,} bytes of data; not checked"
    if files.open(info.file) is None:
        return "not a local file; not checked"
    return None


class _Truncated(Exception):
    pass


def _key(info: TensorInfo) -> tuple[str, int, int, str]:
    assert info.data_start is not None and info.data_end is not None
    return info.file, info.data_start, info.data_end, info.dtype


def _scan_range(key: tuple[str, int, int, str], files: _Files, *, ranges: tuple[str, ...],
                rounding: tuple[str, ...], underflow: tuple[str, ...], bar: ByteProgress) -> Any:
    from guard.values.stats import TensorScanner

    path, start, end, code = key
    dtype = "F32" if code == "C64" else code  # NaN/Inf only: a complex is two fp32
    targets = ((), ()) if code == "C64" else (ranges, rounding)
    scanner = TensorScanner(dtype, range_targets=targets[0], rounding_targets=targets[1], underflow_targets=underflow)
    opened = files.open(path)
    assert opened is not None  # a file that does not open is reported before its ranges are scanned (memoised)
    fd, size = opened
    if end > size:
        raise _Truncated(f"tensor bytes truncated: they end at byte {end:,} but the file has {size:,}")
    buffer, scratch = files.workspace()
    for view in _reads(fd, start, end, buffer):
        scanner.update_read(view, scratch, CHUNK_BYTES)
        bar.advance(len(view))
    return scanner.finish()


def _reads(fd: int, start: int, end: int, buffer: mmap.mmap) -> Iterator[memoryview]:
    """The range in reads of ``READ_BYTES`` (whole elements: it and CHUNK_BYTES are multiples of every width)."""
    whole = memoryview(buffer)
    pos = start
    while pos < end:
        want = min(len(buffer), end - pos)
        got = os.preadv(fd, [whole[:want]], pos)
        if got != want:
            raise _Truncated(f"tensor bytes truncated: short read at byte {pos + got:,} (file changed?)")
        yield whole[:want]
        pos += want


def _figures(st: Any) -> dict[str, Any]:
    return {
        "numel": st.numel, "nan": st.nan, "inf": st.inf,
        "max_abs": st.max_abs, "worst_value": st.worst_value, "min_nonzero_abs": st.min_nonzero_abs,
        "casts": {dtypes.display_name(code): cast.to_json() for code, cast in st.casts.items()},
    }


def _tensor_findings(info: TensorInfo, st: Any, in_play: tuple[str, ...], labels: dict[str, str]) -> list[Finding]:
    shape = f"{info.dtype}{list(info.shape)}"
    out = []
    if st.nan or st.inf:
        out.append(make_finding(
            "CG203", info.file,
            f"{st.nan + st.inf:,} non-finite value(s) in {shape}: {st.nan:,} NaN, {st.inf:,} Inf",
            tensor=info.name))
    for code in in_play:
        cast = st.casts.get(code)
        if cast is None:
            continue
        name = dtypes.display_name(code)
        if cast.overflow:
            out.append(make_finding(
                "CG201", info.file,
                f"{cast.overflow:,} value(s) of {shape} overflow {name} ({labels[code]}); "
                f"worst {st.worst_value:.9g}" + (f" (fp16 max ±{FP16_MAX})" if code == "F16" else ""),
                tensor=info.name))
        if cast.flush or cast.inexact_subnormal:
            out.append(make_finding(
                "CG202", info.file,
                f"{cast.flush + cast.inexact_subnormal:,} non-zero value(s) of {shape} underflow {name} "
                f"({labels[code]}): {cast.flush:,} flush to zero, {cast.inexact_subnormal:,} lose precision; "
                f"smallest |x| {st.min_nonzero_abs:.9g}" + (f" (fp16 normal min {FP16_TINY})" if code == "F16" else ""),
                tensor=info.name))
    return out


class _Files:
    """Open descriptors for one model's files; one read buffer per worker thread."""

    def __init__(self) -> None:
        self._fds: dict[str, tuple[int, int] | None] = {}
        self._local = threading.local()

    def workspace(self) -> tuple[mmap.mmap, Any]:
        """This thread's read buffer and scratch arrays, kept across its tensors."""
        from guard.values.stats import Scratch

        if not hasattr(self._local, "buffer"):
            # Page-aligned (anonymous mmap): the kernel copies into it 4x faster than into a
            # bytearray, whose start is not page-aligned.
            self._local.buffer, self._local.scratch = mmap.mmap(-1, READ_BYTES), Scratch()
        return self._local.buffer, self._local.scratch

    def open(self, path: str) -> tuple[int, int] | None:
        if path not in self._fds:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            except OSError:
                self._fds[path] = None
            else:
                self._fds[path] = (fd, os.fstat(fd).st_size)
        return self._fds[path]

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc: object) -> None:
        for entry in self._fds.values():
            if entry is not None:
                os.close(entry[0])
