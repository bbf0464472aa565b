"""CG101-CG105: what floating dtypes a model holds against what was meant."""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from collections.abc import Iterator

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import NORM_PATTERNS, Policy
from guard.dtypes import display_name as dn
from guard.findings import Finding, shown
from guard.inventory import ModelInventory
from guard.tensors import TensorInfo



def policed_float_tensors(inv: ModelInventory, policy: Policy) -> Iterator[TensorInfo]:
    """Floating tensors the dtype policy applies to.

    Quantized payloads (F8/F6/F4, ggml block types) and their scales are quantization
    by design, not a mix; tensors matching keep-fp32 that *are* fp32 are allowed to be;
    so are a GGUF file's 1-D F32 tensors.
    """
    quantized = inv.quantization() is not None
    # formats (issue 13): GGUF file types are "mostly X, except 1-d tensors", which stay F32
    gguf_files = {scan.path for scan in inv.files if scan.format == "gguf"}
    for tensor in inv.tensors:
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


def expected_dtype(inv: ModelInventory, policy: Policy) -> str | None:
    if policy.expect == "uniform":
        return None
    if policy.expect == "config":
        declared = [dtypes.parse_dtype_name(c.value) for c in inv.config_dtypes()]
        declared = [code for code in declared if code]
        return declared[0] if declared else None
    return policy.expect


def check_unexpected_dtype(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    expected = expected_dtype(inv, policy)
    if expected is None:
        return
    groups: dict[tuple[str, str], list[TensorInfo]] = defaultdict(list)
    for tensor in policed_float_tensors(inv, policy):
        if tensor.dtype != expected:
            groups[(tensor.file, tensor.dtype)].append(tensor)
    how = "config.json's dtype" if policy.expect == "config" else "--expect"
    for (file, code), tensors in sorted(groups.items()):
        params = sum(t.numel for t in tensors)
        yield make_finding(
            "CG101", file,
            f"{len(tensors)} floating tensor(s) ({params:,} parameters) are {dn(code)}, "
            f"expected {dn(expected)} ({how}); e.g. {shown(tensors[0].name)}",
            tensor=tensors[0].name,
        )


def check_mixed_float_dtypes(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    by_dtype: dict[str, list[TensorInfo]] = defaultdict(list)
    for tensor in policed_float_tensors(inv, policy):
        by_dtype[tensor.dtype].append(tensor)
    if len(by_dtype) < 2:
        return
    ranked = sorted(by_dtype.items(), key=lambda kv: -sum(t.numel for t in kv[1]))
    parts = ", ".join(
        f"{dn(code)}: {len(ts)} tensors / {sum(t.numel for t in ts):,} params" for code, ts in ranked
    )
    minority = ranked[-1][1][0]
    yield make_finding(
        "CG102", minority.file,
        f"model {inv.path!r} mixes floating dtypes ({parts}); e.g. {shown(minority.name)} is "
        f"{dn(minority.dtype)}. Convert to one dtype or allow deliberate fp32 tensors with --keep-fp32",
        tensor=minority.name,
    )


def check_config_dtype(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    if inv.config_path is None:
        return
    weights = _dominant_float(inv, policy)
    if weights is None:
        return
    for item in inv.config_dtypes():
        if item.value == "auto":
            continue
        code = dtypes.parse_dtype_name(item.value)
        if code is None or code == weights:
            continue
        yield make_finding(
            "CG103", inv.config_path,
            f"config.json {item.key} is {item.value!r} but the weights are {dn(weights)}",
            line=item.line,
        )


def _dominant_float(inv: ModelInventory, policy: Policy) -> str | None:
    totals: dict[str, int] = defaultdict(int)
    for tensor in policed_float_tensors(inv, policy):
        totals[tensor.dtype] += tensor.numel
    if not totals:
        return None
    return max(totals, key=lambda code: totals[code])


def check_low_precision_norms(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    groups: dict[str, list[TensorInfo]] = defaultdict(list)
    for tensor in inv.tensors:
        if tensor.dtype in ("BF16", "F16") and _is_norm(tensor.name):
            groups[tensor.file].append(tensor)
    for file, tensors in sorted(groups.items()):
        kinds = sorted({dn(t.dtype) for t in tensors})
        yield make_finding(
            "CG104", file,
            f"{len(tensors)} normalization parameter(s) stored in {'/'.join(kinds)}; "
            f"e.g. {shown(tensors[0].name)}. Many recipes keep norms in fp32",
            tensor=tensors[0].name,
        )


def _is_norm(name: str) -> bool:
    lowered = name.lower()
    return any(fnmatch.fnmatchcase(lowered, pattern) for pattern in NORM_PATTERNS)


def check_float64(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    groups: dict[str, list[TensorInfo]] = defaultdict(list)
    for tensor in inv.tensors:
        if tensor.dtype == "F64":
            groups[tensor.file].append(tensor)
    for file, tensors in sorted(groups.items()):
        size = sum(t.nbytes or 0 for t in tensors)
        yield make_finding(
            "CG105", file,
            f"{len(tensors)} tensor(s) in fp64 ({size:,} bytes, twice fp32); e.g. {shown(tensors[0].name)}",
            tensor=tensors[0].name,
        )
