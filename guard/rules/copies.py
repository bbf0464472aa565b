"""CG107: copies of one model that should hold the same weights, and do not.

Format copies of one variant (safetensors, PyTorch, Flax, TF, the original
layout) must agree on dtypes, weighted by parameters: bart-large's fp16 PyTorch
weights beside an fp32 Flax copy is this, not a mix within one model.  Where
two sets share a naming scheme (safetensors and ``.bin``; a default and a
non-dtype variant of one format) their tensor names and shapes must agree too,
allowing for the tied aliases that ``.bin`` keeps and safetensors drops.
Each copy is compared with its group's reference (the primary, or the
best-ranked set of that variant), so n copies give at most n - 1 findings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.dtypes import display_name as dn
from guard.findings import Finding, shown
from guard.inventory import ModelInventory, WeightSet
from guard.tensors import TensorInfo

COPY_LAYOUTS = ("hf", "original", "fsdp")  # one model's copies; loose files and exports are their own
PYTORCH_NAMES = ("safetensors", "torch")  # formats that keep PyTorch's state-dict names
SHARE_TOLERANCE = 0.01  # of the floating parameters
_SAMPLE = 3


def check_copies_agree(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    copies = [ws for ws in inv.sets if ws.role == "weights" and ws.layout in COPY_LAYOUTS
              and any(True for _ in ws.tensors) and inv.quantization(ws) is None]
    by_variant: dict[str | None, list[WeightSet]] = defaultdict(list)
    for ws in copies:
        by_variant[ws.variant].append(ws)
    for group in by_variant.values():
        reference = next((ws for ws in group if ws.primary), group[0])
        for ws in group:
            if ws is reference:
                continue
            yield from _dtypes_disagree(reference, ws)
            if ws.format in PYTORCH_NAMES and reference.format in PYTORCH_NAMES and ws.layout == reference.layout:
                yield from _names_disagree(reference, ws)
    default = next((ws for ws in by_variant.get(None, []) if ws.primary), None)
    if default is None:
        return
    for ws in copies:
        if ws.variant is not None and ws.variant_dtype is None and ws.format == default.format \
                and ws.layout == default.layout:
            yield from _names_disagree(default, ws)


def _shares(ws: WeightSet) -> dict[str, float]:
    totals = {code: n for code, n in ws.parameters_by_dtype().items() if dtypes.is_float(code)}
    whole = sum(totals.values()) or 1
    return {code: n / whole for code, n in totals.items()}


def _dtypes_disagree(reference: WeightSet, ws: WeightSet) -> Iterator[Finding]:
    ref, other = _shares(reference), _shares(ws)
    if not ref or not other:
        return
    gap = max(abs(ref.get(code, 0.0) - other.get(code, 0.0)) for code in set(ref) | set(other))
    if max(ref, key=ref.__getitem__) == max(other, key=other.__getitem__) and gap <= SHARE_TOLERANCE:
        return
    yield make_finding(
        "CG107", ws.files[0].path,
        f"{ws.name} holds {_describe(other)} but {reference.name} holds {_describe(ref)}: two copies of one "
        f"model disagree, so the weights a user gets depend on which copy their library loads",
    )._replace(set=ws.name)


def _describe(shares: dict[str, float]) -> str:
    ranked = sorted(shares.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{dn(code)} {share:.1%}" for code, share in ranked[:3])


def _names_disagree(reference: WeightSet, ws: WeightSet) -> Iterator[Finding]:
    ref, other = _floats(reference), _floats(ws)
    ref_storages, other_storages = _storages(reference), _storages(ws)  # once, not once per name
    only_ref = sorted(n for n in set(ref) - set(other) if not _tied_alias(ref[n], ref_storages, other))
    only_other = sorted(n for n in set(other) - set(ref) if not _tied_alias(other[n], other_storages, ref))
    reshaped = sorted(n for n in set(ref) & set(other) if ref[n].shape != other[n].shape)
    problems = []
    if only_other:
        problems.append(f"{len(only_other)} tensor(s) only in {ws.name} ({_sample(only_other)})")
    if only_ref:
        problems.append(f"{len(only_ref)} only in {reference.name} ({_sample(only_ref)})")
    if reshaped:
        first = reshaped[0]
        problems.append(f"{len(reshaped)} with other shapes (e.g. {shown(first)}: {list(other[first].shape)} "
                        f"against {list(ref[first].shape)})")
    if problems:
        example = (only_other or reshaped or only_ref)[0]
        yield make_finding("CG107", ws.files[0].path,
                           f"{ws.name} and {reference.name} should hold the same tensors: " + "; ".join(problems),
                           tensor=example)._replace(set=ws.name)


def _floats(ws: WeightSet) -> dict[str, TensorInfo]:
    return {t.name: t for t in ws.tensors if dtypes.is_float(t.dtype)}


def _storages(ws: WeightSet) -> dict[tuple[str, str], list[str]]:
    names: dict[tuple[str, str], list[str]] = defaultdict(list)
    for tensor in ws.tensors:
        if tensor.storage is not None:
            names[(tensor.file, tensor.storage)].append(tensor.name)
    return names


def _tied_alias(tensor: TensorInfo, storages: dict[tuple[str, str], list[str]],
                other: dict[str, TensorInfo]) -> bool:
    """A .bin keeps tied weights as two names on one storage; safetensors keeps one of them."""
    if tensor.storage is None:
        return False
    return any(name != tensor.name and name in other for name in storages.get((tensor.file, tensor.storage), ()))


def _sample(names: list[str]) -> str:
    return ", ".join(shown(n) for n in names[:_SAMPLE]) + (f" and {len(names) - _SAMPLE} more"
                                                           if len(names) > _SAMPLE else "")
