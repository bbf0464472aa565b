"""CG106: dtypes a conversion target cannot hold as-is."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence

from guard.catalogue import make_finding
from guard.config import Policy
from guard.dtypes import display_name as dn
from guard.findings import Finding, shown
from guard.inventory import ModelInventory, WeightSet
from guard.inventory.quantization import component_roles
from guard.tensors import FileScan, TensorInfo

_NEEDS_ML_DTYPES = {"BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0",
                    "F6_E2M3", "F6_E3M2", "F4"}

# framework -> {code: why}
UNSUPPORTED: dict[str, dict[str, str]] = {
    "numpy": {code: "plain numpy has no such dtype (it needs ml_dtypes)" for code in _NEEDS_ML_DTYPES},
    "jax": {
        "F64": "becomes fp32 under JAX's default 32-bit mode (jax_enable_x64 off)",
        "I64": "becomes int32 under JAX's default 32-bit mode (jax_enable_x64 off)",
        "U64": "becomes uint32 under JAX's default 32-bit mode (jax_enable_x64 off)",
    },
    "torch": {
        "F6_E2M3": "torch has no float6 dtype",
        "F6_E3M2": "torch has no float6 dtype",
        "U16": "torch before 2.3 has no uint16, and few ops support it",
        "U32": "torch before 2.3 has no uint32, and few ops support it",
        "U64": "torch before 2.3 has no uint64, and few ops support it",
    },
}
UNSUPPORTED["flax"] = UNSUPPORTED["jax"]
# docs/formats.md has the sources.  Float8 and int4 initializers are left alone: quantized ONNX
# models feed them to DequantizeLinear, which the CPU provider implements for those types.
UNSUPPORTED["onnxruntime"] = {
    "BF16": "has no kernel in ONNX Runtime's CPU provider for most operators (MatMul, Add, Mul, ...: "
            "NOT_IMPLEMENTED); export fp16 or fp32 for CPU",
}

# The runtime a format's files are made for: their tensors meet its limits whatever --target says.
FORMAT_TARGETS: dict[str, str] = {"onnx": "onnxruntime"}

# Weight sets in export formats that `convert` never reads: their dtypes do not reach a conversion target
# (each runs under its own runtime; ONNX's limits are FORMAT_TARGETS above).
EXPORT_FORMATS = frozenset({"onnx", "openvino", "tflite", "coreml", "tensorflow"})
_EXPORT_FILE_FORMATS = frozenset({"onnx", "openvino", "tflite", "coreml", "tf-bundle"})

# Integer buffers Flax models do not carry (transformers rebuilds them), so their
# width never reaches JAX: position/token-type id tables, batch-norm counters.
_FLAX_DROPPED_BUFFERS = ("_ids", "num_batches_tracked")  # name endings (the globs *_ids, *num_batches_tracked)


def format_target_findings(scan: FileScan) -> list[Finding]:
    """CG106 for a file's tensors that its format's own runtime cannot run (an .onnx under ONNX Runtime)."""
    runtime = FORMAT_TARGETS.get(scan.format or "")
    if runtime is None:
        return []
    table = UNSUPPORTED[runtime]
    groups: dict[str, list[str]] = defaultdict(list)
    for tensor in scan.tensors:
        if tensor.dtype in table:
            groups[tensor.dtype].append(tensor.name)
    return [make_finding("CG106", scan.path, f"{runtime} (the runtime of {scan.format} files): "
                         f"{len(names)} {dn(code)} tensor(s) {table[code]}; e.g. {shown(names[0])}",
                         tensor=names[0])
            for code, names in sorted(groups.items())]


def check_target_support(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in inv.sets:
        if ws.judged:
            for scan in ws.files:
                yield from (f._replace(set=ws.name) for f in format_target_findings(scan))
            if ws.format in EXPORT_FORMATS or all(scan.format in _EXPORT_FILE_FORMATS for scan in ws.files):
                continue  # an export is run by its runtime, never converted: its I64 shape constants are not for JAX
            yield from (f._replace(set=ws.name) for f in _check_set(_converted_tensors(inv, ws), policy))


def _converted_tensors(inv: ModelInventory, ws: WeightSet) -> Mapping[str, Sequence[TensorInfo]]:
    """The set's tensors by dtype; a quantized set's components left out (a conversion dequantizes them away,
    or refuses: their dtypes never meet the target)."""
    by_dtype = ws.by_dtype()
    roles = component_roles(inv, ws) if inv.quantization(ws) is not None else {}
    if not roles:
        return by_dtype
    from guard.inventory.quant_modules import unroled_tensors  # the set is quantized

    kept: dict[str, list[TensorInfo]] = {code: [] for code in by_dtype}  # the set's order of codes
    for tensor in unroled_tensors(ws, roles):  # a few: embeddings, norms, a head (kept once per set)
        kept[tensor.dtype].append(tensor)
    return {code: group for code, group in kept.items() if group}


def _check_set(by_dtype: Mapping[str, Sequence[TensorInfo]], policy: Policy) -> Iterator[Finding]:
    for target in policy.targets:
        table = UNSUPPORTED.get(target.framework, {})
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for code in by_dtype.keys() & table.keys():  # the few codes a target lacks, not every tensor
            for tensor in by_dtype[code]:
                if not (target.framework in ("flax", "jax") and code in ("I64", "U64")
                        and _dropped_buffer(tensor.name)):
                    groups[(tensor.file, code)].append(tensor.name)
        for (file, code), names in sorted(groups.items()):
            yield make_finding(
                "CG106", file,
                f"target {target.framework}: {len(names)} {dn(code)} tensor(s) {table[code]}; "
                f"e.g. {shown(names[0])}",
                tensor=names[0],
            )


def _dropped_buffer(name: str) -> bool:
    return name.endswith(_FLAX_DROPPED_BUFFERS)
