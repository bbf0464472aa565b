"""The value checks a narrowing cast runs before anything is written (CG201-CG204).

The kernel is ``guard.values.stats.TensorScanner`` (the one ``scan --values`` runs), fed
1 MiB chunks: byte ranges of the file are read into one reused buffer, and a tensor only
a loader can read (a pickle's storage) is loaded and fed in the same chunks.  Widening
casts and casts every value survives (``cast_is_exact``) are not read at all.

What refuses the cast (an error; a warning under ``--allow-lossy``): values that become
inf (CG201) and non-zero values that become zero (CG202).  Reported without refusing:
values that survive as rounded subnormals (CG202, warning), NaN/Inf already in the
weights (CG203, warning: the cast carries them unchanged) and the rounding of every
other value (CG204, one note per file, the worst tensor named), which is what a
narrower dtype means.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import GuardError
from guard.findings import Finding, Severity, shown
from guard.values.check import require_extras
from guard.write.plan import SourceTensor
from guard.write.produce import ranged
from guard.write.writer import OutputTensor

CHUNK_BYTES = 1 << 20


def narrowing(source: str, target: str) -> bool:
    """Some value of ``source`` changes when cast to ``target``."""
    if source == target:
        return False
    require_extras()
    from guard.values.stats import IEEE_BITS, cast_is_exact

    return source in IEEE_BITS and not cast_is_exact(source, target)


def cast_value_findings(outputs: list[OutputTensor], *, where: Callable[[SourceTensor], str],
                        allow_lossy: bool) -> list[Finding]:
    """Findings for every narrowing cast among ``outputs`` (``where``: a source tensor's display path)."""
    findings: list[Finding] = []
    rounding: dict[tuple[str, str], list[tuple[float, str, int]]] = {}
    losing = Severity.warning if allow_lossy else Severity.error
    for tensor in outputs:
        source = tensor.mapped.source
        if not narrowing(source.info.dtype, tensor.dtype):
            continue
        stats = _scan(source, tensor.dtype)
        path, name = where(source), source.name
        cast = stats.casts.get(tensor.dtype)
        what = f"{source.info.dtype}{list(source.info.shape)} cast to {dtypes.display_name(tensor.dtype)}"
        if stats.nan or stats.inf:
            findings.append(make_finding(
                "CG203", path, f"{stats.nan + stats.inf:,} non-finite value(s) in {what} ({stats.nan:,} NaN, "
                f"{stats.inf:,} Inf); the cast carries them unchanged", tensor=name,
            )._replace(severity=Severity.warning))
        if cast is None:
            continue
        if cast.overflow:
            findings.append(make_finding(
                "CG201", path, f"{cast.overflow:,} value(s) of {what} overflow and become inf "
                f"(worst {stats.worst_value:.9g})" + _lossy_hint(allow_lossy), tensor=name)._replace(severity=losing))
        if cast.flush:
            findings.append(make_finding(
                "CG202", path, f"{cast.flush:,} non-zero value(s) of {what} flush to zero (smallest |x| "
                f"{stats.min_nonzero_abs:.9g})" + _lossy_hint(allow_lossy), tensor=name)._replace(severity=losing))
        elif cast.inexact_subnormal:
            findings.append(make_finding(
                "CG202", path, f"{cast.inexact_subnormal:,} tiny value(s) of {what} survive as rounded subnormals",
                tensor=name)._replace(severity=Severity.warning))
        if cast.rounded:
            rounding.setdefault((path, tensor.dtype), []).append((cast.max_rel_error, name, cast.rounded))
    for (path, code), rows in rounding.items():
        err, name, _ = max(rows, key=lambda row: row[0])
        findings.append(make_finding(
            "CG204", path, f"casting to {dtypes.display_name(code)} rounds {sum(r[2] for r in rows):,} value(s) in "
            f"{len(rows)} tensor(s); max relative error {err:.3g}, in {shown(name)}", tensor=name))
    return findings


def refusing(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity is Severity.error]


def _lossy_hint(allow_lossy: bool) -> str:
    return "; written anyway (--allow-lossy)" if allow_lossy else "; refused (--allow-lossy writes it anyway)"


def _scan(source: SourceTensor, target: str) -> Any:
    from guard.values.stats import Scratch, TensorScanner

    scanner = TensorScanner(source.info.dtype, range_targets=(target,), rounding_targets=(target,))
    scratch = Scratch()
    for chunk in _chunks(source):
        scanner.update(chunk, scratch)
    return scanner.stats


def _chunks(source: SourceTensor) -> Iterator[memoryview]:
    """The tensor's raw bytes in whole-element chunks of at most CHUNK_BYTES."""
    info = source.info
    if ranged(source):
        assert info.data_start is not None and info.data_end is not None
        buffer = bytearray(CHUNK_BYTES)
        view = memoryview(buffer)
        fd = os.open(info.file, os.O_RDONLY)
        try:
            pos = info.data_start
            while pos < info.data_end:
                want = min(CHUNK_BYTES, info.data_end - pos)
                got = os.preadv(fd, [view[:want]], pos)
                if got != want:
                    raise GuardError(f"{info.file}: {shown(info.name)} is truncated; nothing written")
                yield view[:want]
                pos += want
        finally:
            os.close(fd)
        return
    import numpy as np

    flat = np.ascontiguousarray(source.load()).reshape(-1).view(np.uint8)
    for start in range(0, flat.size, CHUNK_BYTES):
        yield memoryview(flat[start:start + CHUNK_BYTES])  # type: ignore[arg-type]  # numpy types __buffer__ from 3.12

