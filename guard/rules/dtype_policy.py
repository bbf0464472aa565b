"""CG101-CG105: what floating dtypes each weight set holds against what was meant."""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from collections.abc import Iterator

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import NORM_PATTERNS, Policy
from guard.dtypes import display_name as dn
from guard.findings import Finding, shown
from guard.inventory import ModelInventory, WeightSet
from guard.tensors import TensorInfo


def judged_sets(inv: ModelInventory) -> Iterator[WeightSet]:
    """Weights and adapters: training state never gets CG101-CG109."""
    return (ws for ws in inv.sets if ws.judged)


def policed_float_tensors(inv: ModelInventory, ws: WeightSet, policy: Policy) -> tuple[TensorInfo, ...]:
    """Floating tensors of one set the dtype policy applies to (computed once per set and policy).

    Quantized payloads (F8/F6/F4, ggml block types) and their scales are quantization
    by design, not a mix; tensors matching keep-fp32 that *are* fp32 are allowed to be;
    so are a GGUF file's 1-D F32 tensors.
    """
    key = ("policed", policy)
    cached = ws.memo.get(key)
    if cached is None:
        cached = ws.memo[key] = tuple(_policed(inv, ws, policy))
    return cached  # type: ignore[no-any-return]


def _policed(inv: ModelInventory, ws: WeightSet, policy: Policy) -> Iterator[TensorInfo]:
    quantized = inv.quantization(ws) is not None
    # GGUF file types are "mostly X, except 1-d tensors", which stay F32 by design
    gguf_files = {scan.path for scan in ws.files if scan.format == "gguf"}
    for tensor in ws.tensors:
        if not dtypes.is_float(tensor.dtype):
            continue
        if tensor.file in gguf_files and tensor.dtype == "F32" and len(tensor.shape) <= 1:
            continue
        if tensor.dtype in dtypes.QUANTIZED_CODES:
            continue
        if quantized and "scale" in tensor.name.lower():
            continue
        if tensor.dtype == "F32" and policy.keeps_fp32(tensor.name):
            continue
        yield tensor


def declared_dtype(inv: ModelInventory) -> str | None:
    declared = [dtypes.parse_dtype_name(c.value) for c in inv.config_dtypes()]
    declared = [code for code in declared if code]
    return declared[0] if declared else None


def expected_dtypes(inv: ModelInventory, ws: WeightSet, policy: Policy) -> tuple[set[str], str] | None:
    """The dtypes CG101 accepts in one set, and where that expectation comes from.

    A set whose name claims a dtype (``fp16`` variant) is judged by CG108 instead.
    An adapter may also be fp32: PEFT trains adapters in fp32 beside a low-precision base.
    """
    if ws.claimed_dtype is not None or policy.expect == "uniform":
        return None
    if policy.expect == "config":
        expected = declared_dtype(inv)
        how = "config.json's dtype"
    else:
        expected, how = policy.expect, "--expect"
    if expected is None:
        return None
    allowed = {expected, "F32"} if ws.role == "adapter" else {expected}
    return allowed, how


def check_unexpected_dtype(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        expectation = expected_dtypes(inv, ws, policy)
        if expectation is None:
            continue
        allowed, how = expectation
        groups: dict[tuple[str, str], list[TensorInfo]] = defaultdict(list)
        for tensor in policed_float_tensors(inv, ws, policy):
            if tensor.dtype not in allowed:
                groups[(tensor.file, tensor.dtype)].append(tensor)
        wanted = " or ".join(dn(code) for code in sorted(allowed))
        for (file, code), tensors in sorted(groups.items()):
            params = sum(t.numel for t in tensors)
            yield make_finding(
                "CG101", file,
                f"{len(tensors)} floating tensor(s) ({params:,} parameters) are {dn(code)}, "
                f"expected {wanted} ({how}); e.g. {shown(tensors[0].name)}",
                tensor=tensors[0].name,
            )._replace(set=ws.name)


def check_mixed_float_dtypes(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        by_dtype: dict[str, list[TensorInfo]] = defaultdict(list)
        for tensor in policed_float_tensors(inv, ws, policy):
            by_dtype[tensor.dtype].append(tensor)
        if len(by_dtype) < 2:
            continue
        ranked = sorted(by_dtype.items(), key=lambda kv: -sum(t.numel for t in kv[1]))
        parts = ", ".join(
            f"{dn(code)}: {len(ts)} tensors / {sum(t.numel for t in ts):,} params" for code, ts in ranked
        )
        minority = ranked[-1][1][0]
        yield make_finding(
            "CG102", minority.file,
            f"{ws.name} of model {inv.path!r} mixes floating dtypes ({parts}); e.g. {shown(minority.name)} is "
            f"{dn(minority.dtype)}. Convert to one dtype or allow deliberate fp32 tensors with --keep-fp32",
            tensor=minority.name,
        )._replace(set=ws.name)


def dominant_float(inv: ModelInventory, ws: WeightSet, policy: Policy) -> str | None:
    """The policed floating dtype holding the most parameters (once per set and policy: CG103 and
    CG108 both ask)."""
    key = ("dominant", policy)
    if key not in ws.memo:
        totals: dict[str, int] = defaultdict(int)
        for tensor in policed_float_tensors(inv, ws, policy):
            totals[tensor.dtype] += tensor.numel
        ws.memo[key] = max(totals, key=lambda code: totals[code]) if totals else None
    return ws.memo[key]  # type: ignore[return-value]


def check_low_precision_norms(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        if ws.claimed_dtype in ("BF16", "F16"):
            continue  # a half-precision copy by name: its norms are half precision by design
        groups: dict[str, list[TensorInfo]] = defaultdict(list)
        for tensor in ws.tensors:
            if tensor.dtype in ("BF16", "F16") and _is_norm(tensor.name):
                groups[tensor.file].append(tensor)
        for file, tensors in sorted(groups.items()):
            kinds = sorted({dn(t.dtype) for t in tensors})
            yield make_finding(
                "CG104", file,
                f"{len(tensors)} normalization parameter(s) stored in {'/'.join(kinds)}; "
                f"e.g. {shown(tensors[0].name)}. Many recipes keep norms in fp32",
                tensor=tensors[0].name,
            )._replace(set=ws.name)


def _is_norm(name: str) -> bool:
    lowered = name.lower()
    return any(fnmatch.fnmatchcase(lowered, pattern) for pattern in NORM_PATTERNS)


def check_float64(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        groups: dict[str, list[TensorInfo]] = defaultdict(list)
        for tensor in ws.tensors:
            if tensor.dtype == "F64":
                groups[tensor.file].append(tensor)
        for file, tensors in sorted(groups.items()):
            size = sum(t.nbytes or 0 for t in tensors)
            yield make_finding(
                "CG105", file,
                f"{len(tensors)} tensor(s) in fp64 ({size:,} bytes, twice fp32); e.g. {shown(tensors[0].name)}",
                tensor=tensors[0].name,
            )._replace(set=ws.name)
