"""PT <-> Flax names and layouts, resolved against the target's template tree.

The candidate list mirrors transformers' ``rename_key_and_reshape_tensor``: ``weight``
may be a norm ``scale``, an ``embedding`` or a ``kernel``, and only the target tree
says which.  Without a template (a model_type transformers does not know) the same
rules pick by rank and name.  A source tensor that fits nowhere, a template entry
nothing fills, and a shape that does not fit are all CG304.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from guard.catalogue import make_finding
from guard.convert.source import SourceModel, SourceTensor
from guard.convert.templates import Key, Template
from guard.findings import Finding

Perm = tuple[int, ...]
KERNEL_PERMS: dict[int, Perm] = {2: (1, 0), 3: (2, 1, 0), 4: (2, 3, 1, 0), 5: (2, 3, 4, 1, 0)}
EMBEDDING_HINTS = re.compile(r"embed|^wte$|^wpe$|^shared$|^relative_attention_bias$")
DROP_ALWAYS = ("num_batches_tracked",)  # PyTorch BatchNorm bookkeeping; Flax has no counterpart


def inverse(perm: Perm) -> Perm:
    return tuple(sorted(range(len(perm)), key=perm.__getitem__))


def permuted(shape: tuple[int, ...], perm: Perm | None) -> tuple[int, ...]:
    return shape if perm is None else tuple(shape[i] for i in perm)


@dataclass(frozen=True)
class Mapped:
    source: SourceTensor
    target: Key
    perm: Perm | None  # axes of the source array, in target order

    @property
    def shape(self) -> tuple[int, ...]:
        return permuted(self.source.info.shape, self.perm)


@dataclass
class Mapping:
    how: str
    tensors: list[Mapped] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    unmatched: list[SourceTensor] = field(default_factory=list)  # resolved later: tied alias or CG304
    dropped: list[str] = field(default_factory=list)
    tied: list[str] = field(default_factory=list)  # target entries left for transformers to tie


Candidate = tuple[Key, "Perm | None", str]  # target key, permutation, collection ("params" | "batch_stats")


def pt_to_flax(key: Key, ndim: int, *, rules: bool) -> list[Candidate]:
    base, last = key[:-1], key[-1]
    out: list[Candidate] = []
    if last == "running_mean":
        return [(base + ("mean",), None, "batch_stats")]
    if last == "running_var":
        return [(base + ("var",), None, "batch_stats")]
    if len(key) >= 3 and key[-3] == "parametrizations" and last in ("original0", "original1"):
        return [(key[:-3] + (key[-2] + ("_g" if last == "original0" else "_v"),), None, "params")]
    if last in ("weight", "gamma") and (not rules or ndim == 1):
        out.append((base + ("scale",), None, "params"))
    if last == "weight" and (not rules or (ndim == 2 and any(EMBEDDING_HINTS.search(p) for p in base))):
        out.append((base + ("embedding",), None, "params"))
    if last == "weight" and ndim in KERNEL_PERMS:
        out.append((base + ("kernel",), KERNEL_PERMS[ndim], "params"))
    if last in ("gamma", "beta"):
        out.append((base + ("weight" if last == "gamma" else "bias",), None, "params"))
    out.append((key, None, "params"))
    return out


def flax_to_pt(key: Key, ndim: int) -> list[Candidate]:
    collection = "params"
    if key and key[0] in ("params", "batch_stats"):
        collection, key = key[0], key[1:]
    base, last = key[:-1], key[-1]
    if collection == "batch_stats" and last in ("mean", "var"):
        return [(base + ("running_" + last,), None, collection)]
    out: list[Candidate] = []
    if last == "kernel" and ndim in KERNEL_PERMS:
        out.append((base + ("weight",), inverse(KERNEL_PERMS[ndim]), collection))
    if last in ("scale", "embedding"):
        out.append((base + ("weight",), None, collection))
    if last in ("weight_g", "weight_v"):
        out.append((base + ("parametrizations", "weight", "original" + ("0" if last == "weight_g" else "1")),
                    None, collection))
    out.append((key, None, collection))
    return out


def map_tensors(source: SourceModel, template: Template | None, *, to: str) -> Mapping:
    """Assign every source tensor a target key and layout; leftovers go to ``unmatched``."""
    if source.framework == to:
        mapping = Mapping("identity")
        mapping.tensors = [Mapped(t, tuple(t.name.split(source.separator)), None) for t in source.tensors]
        return mapping
    mapping = Mapping(f"template:{template.architecture}" if template else "rules")
    covered: dict[Key, str] = {}
    for tensor in source.tensors:
        key = tuple(tensor.name.split(source.separator))
        if key[-1] in DROP_ALWAYS:
            mapping.dropped.append(tensor.name)
            continue
        info = tensor.info
        candidates = (flax_to_pt(key, len(info.shape)) if to == "torch"
                      else pt_to_flax(key, len(info.shape), rules=template is None))
        if template is None:
            target, perm, collection = candidates[0]
            if to == "torch" or collection == "params":
                mapping.tensors.append(Mapped(tensor, target, perm))
            else:
                mapping.tensors.append(Mapped(tensor, (collection, *target), perm))
            continue
        found = _resolve(candidates, info.shape, template)
        if isinstance(found, str):
            if any(re.search(p, tensor.name) for p in template.ignored):
                mapping.dropped.append(tensor.name)
            elif found:
                mapping.findings.append(make_finding("CG304", info.file, found, tensor=tensor.name))
            else:
                mapping.unmatched.append(tensor)
            continue
        target, perm = found
        if target in covered:
            mapping.findings.append(make_finding(
                "CG304", info.file, f"{tensor.name} and {covered[target]} both map to {'.'.join(target)}",
                tensor=tensor.name))
            continue
        covered[target] = tensor.name
        mapping.tensors.append(Mapped(tensor, target, perm))
    if template is not None:
        _missing(mapping, template, covered, sep="/" if to == "flax" else ".")
    return mapping


def _variants(key: Key, collection: str, template: Template) -> list[Key]:
    keys = [key]
    if template.prefix:
        keys.append((template.prefix, *key))
        if key and key[0] == template.prefix:
            keys.append(key[1:])
    if any(k[0] in ("params", "batch_stats") for k in template.shapes if k):
        keys = [(collection, *k) for k in keys]
    return keys


def _resolve(candidates: list[Candidate], shape: tuple[int, ...],
             template: Template) -> tuple[Key, Perm | None] | str:
    """The first candidate in the template whose shape fits; else why not ("" when nothing is named)."""
    misfit = ""
    for target, perm, collection in candidates:
        for key in _variants(target, collection, template):
            want = template.shapes.get(key)
            if want is None:
                continue
            if permuted(shape, perm) == want:
                return key, perm
            misfit = misfit or (f"shape {list(permuted(shape, perm))} does not fit {'/'.join(key)} "
                                f"{list(want)} in {template.architecture}")
    return misfit


def _missing(mapping: Mapping, template: Template, covered: dict[Key, str], *, sep: str) -> None:
    filled = {template.tied.get(k, k) for k in covered}
    for key in sorted(set(template.shapes) - set(covered)):
        if template.tied.get(key, key) in filled:
            mapping.tied.append(sep.join(key))
        elif key in template.buffers:
            mapping.dropped.append(sep.join(key))  # a buffer the other framework never had: built by the model
        else:
            mapping.findings.append(make_finding(
                "CG304", template.architecture,
                f"{sep.join(key)} {list(template.shapes[key])} has no source tensor; "
                f"transformers would leave it random", tensor=sep.join(key)))


def describe_unmatched(tensor: SourceTensor, template: Template | None) -> Finding:
    where = template.architecture if template else "the target"
    return make_finding("CG304", tensor.info.file,
                        f"{tensor.name} {list(tensor.info.shape)} has no place in {where}", tensor=tensor.name)
