"""CG101-CG105: what floating dtypes each weight set holds against what was meant.

Under a dtype expectation (``--expect fp32|bf16|fp16``) CG101 and CG102 carry their fix: the
set written again in that dtype, keep-fp32 tensors left in fp32 ("set-cast", which waits for
``--cast --replace``).  Under ``uniform`` the dtype to choose is the user's, so there is none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from math import prod
from operator import not_

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy, fp32_keeper, match_flags
from guard.dtypes import display_name as dn
from guard.findings import Finding, shown
from guard.fixes import Fix, make_fix
from guard.inventory import ModelInventory, WeightSet
from guard.inventory.quantization import component_roles
from guard.rules.dtype_fixes import (
    quantized_no_fix,
    relative,  # noqa: F401  (guard.rules.variants imports it from here)
    set_cast_params,
    set_writes,
)
from guard.tensors import TENSOR_FILE, TENSOR_NAME, TENSOR_SHAPE, TensorInfo, column, select


def judged_sets(inv: ModelInventory) -> Iterator[WeightSet]:
    """Weights and adapters: training state never gets CG101-CG109."""
    return (ws for ws in inv.sets if ws.judged)


def policed_float_tensors(inv: ModelInventory, ws: WeightSet, policy: Policy) -> dict[str, Sequence[TensorInfo]]:
    """Floating tensors of one set the dtype policy applies to, by dtype code (once per set and policy).

    Quantized payloads (F8/F6/F4, ggml block types) and a quantized set's components (payloads,
    scales, zeros, metadata: ``component_roles``) are quantization by design, not a mix; tensors matching
    keep-fp32 that *are* fp32 are allowed to be; so are a GGUF file's 1-D F32 tensors.  Codes keep the set's
    order of first appearance.
    """
    key = ("policed", policy)
    cached = ws.memo.get(key)
    if cached is None:
        cached = ws.memo[key] = _policed(inv, ws, policy)
    return cached




def _policed(inv: ModelInventory, ws: WeightSet, policy: Policy) -> dict[str, Sequence[TensorInfo]]:
    quant = inv.quantization(ws)
    if quant is not None and not quant.known:
        return {}  # a method the table does not know: which tensors are its components, nobody here can say
    # a quantized set's payloads, scales, zeros and metadata are components (guard.inventory.quant_conventions)
    roles = component_roles(inv, ws) if quant is not None else {}
    # GGUF file types are "mostly X, except 1-d tensors", which stay F32 by design
    gguf_files = {scan.path for scan in ws.files if scan.format == "gguf"}
    keeps_fp32 = fp32_keeper(policy.keep_fp32)
    policed: dict[str, Sequence[TensorInfo]] = {}  # a group kept whole is the set's own (a tuple or columns)
    for code, group in ws.by_dtype().items():
        if not dtypes.is_float(code) or code in dtypes.QUANTIZED_CODES:
            continue
        if roles:  # in C: a quantized set holds 80,000 tensors
            group = _kept(group, map(not_, map(roles.__contains__, column(TENSOR_NAME, group))))
        if code == "F32" and gguf_files:
            group = tuple(t for t in group if not ((t.file in gguf_files and len(t.shape) <= 1) or keeps_fp32(t.name)))
        elif code == "F32":  # the common case: keep-fp32 alone decides, each name tested in C
            group = _kept(group, map(not_, match_flags(policy.keep_fp32, list(column(TENSOR_NAME, group)))))
        if group:
            policed[code] = group
    whole = ws.by_dtype()
    if any(group is not whole[code] and group[0] != whole[code][0] for code, group in policed.items()):
        # a left-out tensor led its dtype: order the codes by their first policed tensor, as a walk
        # of the set's tensors would meet them (ties in CG102's ranking and the dominant dtype go by it);
        # records are compared by value (a columnar file's picked records are fresh ones)
        firsts = {group[0]: code for code, group in policed.items()}
        order = [firsts[t] for t in ws.tensors if t in firsts]
        policed = {code: policed[code] for code in order}
    return policed


def _kept(group: Sequence[TensorInfo], flags: Iterator[bool]) -> Sequence[TensorInfo]:
    """The group's tensors whose flag is true; the group itself when every flag is (no record made)."""
    kept = list(flags)  # read once: all() and select() both walk them
    return group if all(kept) else tuple(select(group, kept))


def policed_parameters(inv: ModelInventory, ws: WeightSet, policy: Policy) -> dict[str, int]:
    """Elements per policed dtype; a code the policy kept whole reuses the set's own sum."""
    key = ("policed parameters", policy)
    cached = ws.memo.get(key)
    if cached is None:
        whole, totals = ws.by_dtype(), ws.parameters_by_dtype()
        cached = ws.memo[key] = {
            code: totals[code] if len(group) == len(whole[code]) else sum(map(prod, column(TENSOR_SHAPE, group)))
            for code, group in policed_float_tensors(inv, ws, policy).items()}
    return cached


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
        groups = {code: policed for code, policed in policed_float_tensors(inv, ws, policy).items()
                  if code not in allowed}
        if not groups:
            continue
        wanted = " or ".join(dn(code) for code in sorted(allowed))
        # a writer that stores a lower dtype by default says so (OpenVINO IR, Core ML): the message names the cause
        hints = {s.metadata["compressed"]: s.metadata.get("compressed.hint", "") for s in ws.files
                 if "compressed" in s.metadata}
        # one fix for the set (an adapter may stay fp32: the other dtype is the target)
        to = next(iter(allowed - {"F32"}), "F32")
        fix = quantized_no_fix(inv, ws, "CG101") or _cast_fix(inv, ws, policy, to=to)
        # One finding per dtype for the whole set, on its first file holding it: one per shard, each
        # carrying the set's fix (every shard's name), made a sharded set's report quadratic in its shards.
        files = {code: sorted(set(column(TENSOR_FILE, tensors))) for code, tensors in groups.items()}
        for code in sorted(groups, key=lambda c: (files[c][0], c)):
            tensors, first = groups[code], files[code][0]
            example = next(t for t in tensors if t.file == first)
            params = policed_parameters(inv, ws, policy)[code]  # the fix summed them: once per set
            yield make_finding(
                "CG101", first,
                f"{len(tensors)} floating tensor(s) ({params:,} parameters){spread(files[code], ws)} are "
                f"{dn(code)}, expected {wanted} ({how}); e.g. {shown(example.name)}"
                + (f". {hints[code]}" if hints.get(code) else "") + _quantized_note(inv, ws),
                tensor=example.name,
            )._replace(set=ws.name, fix=fix)


def spread(files: list[str], ws: WeightSet) -> str:
    """Where a set's finding is, beyond the file it is reported on (nothing for one file)."""
    if len(files) == 1:
        return ""
    if len(files) == len(ws.files):
        return f" in all {len(files):,} files of the set"
    return f" in {len(files):,} of the set's {len(ws.files):,} files"


def check_mixed_float_dtypes(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        by_dtype = policed_float_tensors(inv, ws, policy)
        if len(by_dtype) < 2:
            continue
        params = policed_parameters(inv, ws, policy)
        ranked = sorted(by_dtype.items(), key=lambda kv: -params[kv[0]])
        parts = ", ".join(f"{dn(code)}: {len(ts)} tensors / {params[code]:,} params" for code, ts in ranked)
        minority = ranked[-1][1][0]
        expectation = expected_dtypes(inv, ws, policy)
        fix = None
        if expectation is not None and ws.role != "adapter":  # uniform: which dtype is the user's to say
            fix = _cast_fix(inv, ws, policy, to=next(iter(expectation[0])))
        fix = quantized_no_fix(inv, ws, "CG102") or fix
        yield make_finding(
            "CG102", minority.file,
            f"{ws.name} of model {inv.path!r} mixes floating dtypes ({parts}); e.g. {shown(minority.name)} is "
            f"{dn(minority.dtype)}. Convert to one dtype or allow deliberate fp32 tensors with --keep-fp32"
            + _quantized_note(inv, ws),
            tensor=minority.name,
        )._replace(set=ws.name, fix=fix)


def _quantized_note(inv: ModelInventory, ws: WeightSet) -> str:
    quant = inv.quantization(ws)
    return f" (the set is quantized, {quant.label}: its unquantized tensors are judged)" if quant is not None else ""


def _cast_fix(inv: ModelInventory, ws: WeightSet, policy: Policy, *, to: str) -> Fix | None:
    """CG101 / CG102 with a dtype expected: the set written again in that dtype (``--cast --replace``)."""
    params = set_cast_params(inv, ws, policy, to=to, policed=policed_parameters(inv, ws, policy))
    if params is None:
        return None
    narrowing = any(code != to and not _widens(code, to) for code in policed_float_tensors(inv, ws, policy))
    return make_fix(
        "set-cast",
        f"write {ws.name} again in {dn(to)}, replacing it (keep-fp32 tensors stay fp32)"
        + ("; the narrowing cast is value-checked first (CG201-CG204) and refused if it loses values, "
           "unless --allow-lossy" if narrowing else "; widening is exact"),
        safety="needs-flag", flag="--cast --replace", writes=set_writes(inv, ws), **params)


def _widens(held: str, to: str) -> bool:
    """Every value survives (fp16 -> fp32); bf16 -> fp16 keeps the width and still loses range."""
    a, b = dtypes.DTYPES.get(held), dtypes.DTYPES.get(to)
    return a is not None and b is not None and b.bits > a.bits


def dominant_float(inv: ModelInventory, ws: WeightSet, policy: Policy) -> str | None:
    """The policed floating dtype holding the most parameters (once per set and policy: CG103 and
    CG108 both ask)."""
    totals = policed_parameters(inv, ws, policy)
    return max(totals, key=totals.__getitem__) if totals else None


def check_float64(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        groups: dict[str, list[TensorInfo]] = defaultdict(list)
        for tensor in ws.by_dtype().get("F64", ()):
            groups[tensor.file].append(tensor)
        for file, tensors in sorted(groups.items()):
            size = sum(t.nbytes or 0 for t in tensors)
            yield make_finding(
                "CG105", file,
                f"{len(tensors)} tensor(s) in fp64 ({size:,} bytes, twice fp32); e.g. {shown(tensors[0].name)}",
                tensor=tensors[0].name,
            )._replace(set=ws.name)
