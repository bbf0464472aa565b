"""Every source tensor's fate: a target name and layout, or a decision the report shows.

The architecture is the config's ``model_type``, looked up in ``guard.convert.map.families``
(composites route each sub-model to its own row).  A tensor is mapped by the generic
rules, or dropped as transformers' own loaders drop it: buffers, BatchNorm counters,
frozen sinusoidal tables the Flax class computes, tied aliases bit-identical to the
tensor they alias, and (a warning, refused under ``--strict``) tensors a PyTorch class
holds that its Flax twin has no place for.  Nothing is dropped without a line saying so.
"""

from __future__ import annotations

import re
from typing import Any

from guard.catalogue import make_finding
from guard.convert.map.families import ALIASES, FAMILIES, FLAX_NAMES, Family
from guard.convert.map.mapped import Mapping, Refusal
from guard.convert.map.rules import flax_to_torch, torch_to_flax
from guard.convert.read.source import SourceModel
from guard.findings import Severity
from guard.records import Record
from guard.write.plan import Key, Mapped, Perm, SourceTensor

__all__ = ["Mapped", "Mapping", "Refusal", "map_tensors"]  # Mapped: the writer's input


class Route(Record):
    family: Family
    model_type: str
    config: dict[str, Any]
    head: Key  # the composite's part names before the sub-model's own key
    rest: Key


NO_FLAX_CLASS = ("--to flax and --to torch pair transformers 4's PyTorch and Flax classes only; for JAX, this "
                 "architecture's targets are MaxText (--to maxtext, where MaxText maps it) and the JAX stacks "
                 "that load its safetensors themselves (tunix, keras-hub, EasyDeL)")


def family_of(config: dict[str, Any] | None, *, where: str) -> tuple[str, Family]:
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or not model_type:
        raise Refusal(where, "config.json names no model_type: cannot tell which architecture to convert to")
    found = FAMILIES.get(ALIASES.get(model_type, model_type))
    if found is None:
        known = ", ".join(sorted(FAMILIES))
        raise Refusal(where, f"model_type {model_type[:80]!r} has no Flax class in transformers 4.x, the last line "
                             f"with Flax models; convert pairs: {known}",
                      next_step=NO_FLAX_CLASS)
    return model_type, found


def route(key: Key, config: dict[str, Any], *, where: str, name: str) -> Route:
    model_type, family = family_of(config, where=where)
    head: Key = ()
    while family.parts and key and key[0] in family.parts:
        sub = config.get(family.parts[key[0]])
        if not isinstance(sub, dict):
            raise Refusal(where, f"{model_type} config has no {family.parts[key[0]]!r} sub-config for {name}",
                          tensor=name)
        head, key, config = (*head, key[0]), key[1:], sub
        model_type, family = family_of(config, where=where)
    return Route(family, model_type, config, head, key)


def target_class(config: dict[str, Any], family: Family, keys: list[Key]) -> tuple[str, bool]:
    """(the PyTorch class whose Flax twin is the target, strip the base prefix?)."""
    archs = [a for a in config.get("architectures") or () if isinstance(a, str)]
    chosen = next((a for a in archs if a in family.classes), family.classes[0])
    prefixed = any(k and k[0] == family.prefix for k in keys)
    # a head checkpoint under a base class: transformers loads the base model's part, drops the head
    return chosen, chosen == family.classes[0] and prefixed


def map_tensors(source: SourceModel, config: dict[str, Any] | None, *, to: str, where: str) -> Mapping:
    """Assign every source tensor a target key and layout, or a decision; raises Refusal."""
    if source.framework == to:
        mapping = Mapping("identity")
        mapping.tensors = [Mapped(t, tuple(t.name.split(source.separator)), None) for t in source.tensors]
        return mapping
    _model_type, family = family_of(config, where=where)
    assert config is not None  # family_of refuses anything else
    keys = [tuple(t.name.split(source.separator)) for t in source.tensors]
    cls, strip = target_class(config, family, keys)
    strip = strip and to == "flax"
    architecture = FLAX_NAMES.get(cls, "Flax" + cls) if to == "flax" else cls
    mapping = Mapping("rules", architecture)
    if to == "torch" and family.pt_only.get(cls):
        mapping.findings.append(make_finding(
            "CG304", where, f"{cls} holds tensors its Flax twin has none of ({', '.join(family.pt_only[cls])}): "
                            "transformers will initialize them at random on load (this head does not use them)",
            )._replace(severity=Severity.warning))
    batch_norm = to == "flax" and any(k[-1] == "running_mean" for k in keys)
    covered: dict[Key, str] = {}
    for tensor, key in zip(source.tensors, keys):
        if strip:
            if key[0] != family.prefix:
                mapping.decide("head", tensor)
                continue
            key = key[1:]
        target = _one(tensor, key, config, cls, mapping, to=to, where=where)
        if target is None:
            continue
        new, perm = target
        if batch_norm and new[0] != "batch_stats":
            new = ("params", *new)
        if new in covered:
            mapping.findings.append(make_finding(
                "CG304", tensor.info.file, f"{tensor.name} and {covered[new]} both map to {'/'.join(new)}",
                tensor=tensor.name))
            continue
        covered[new] = tensor.name
        mapping.tensors.append(Mapped(tensor, new, perm))
    if to == "flax" and cls == family.classes[0]:
        held = {m.target[0] for m in mapping.tensors}
        for root in family.base_requires:
            if root not in held:
                mapping.findings.append(make_finding(
                    "CG304", where, f"{architecture} holds a {root!r} that no tensor of the checkpoint fills (a head "
                                    f"checkpoint has none): transformers would initialize it at random; name the head "
                                    f"class in config.json's architectures instead"))
    return mapping


def _one(tensor: SourceTensor, key: Key, config: dict[str, Any], cls: str, mapping: Mapping, *,
         to: str, where: str) -> tuple[Key, Perm | None] | None:
    lookup = key[1:] if to == "torch" and key[0] in ("params", "batch_stats") else key
    r = route(lookup, config, where=where, name=tensor.name)
    rest, name, ndim = r.rest, ".".join(r.rest), len(tensor.info.shape)
    if not rest:  # a composite's part name alone ("encoder"): no module holds a tensor there
        mapping.findings.append(make_finding("CG304", tensor.info.file, f"{tensor.name} has no place in "
                                             f"{mapping.architecture}", tensor=tensor.name))
        return None
    if to == "flax":
        if rest[-1] == "num_batches_tracked":
            mapping.decide("counter", tensor)
            return None
        for kind, patterns in (("buffer", r.family.buffers), ("computed", r.family.computed),
                               ("head", r.family.pt_only.get(cls, ()) if not r.head else ())):
            if any(re.search(p + "$", name) for p in patterns):
                mapping.decide(kind, tensor)
                return None
    root = rest[1] if len(rest) > 1 and rest[0] == r.family.prefix else rest[0] if rest else ""
    if root not in r.family.roots:
        mapping.findings.append(make_finding(
            "CG304", tensor.info.file, f"{tensor.name} {list(tensor.info.shape)} has no place in "
                                       f"{mapping.architecture}: {r.model_type} models have no {root[:80]!r}",
            tensor=tensor.name))
        return None
    if to == "torch":
        return flax_to_torch(key, ndim)
    target = torch_to_flax(key, ndim, norm_weight=r.family.norm_weight)
    tie = r.config.get("tie_word_embeddings", r.family.tie_default)
    if any(re.search(p + "$", name) for p in r.family.always_tied) or (
            tie and any(re.search(p + "$", name) for p in r.family.tied)):
        mapping.aliases.append(Mapped(tensor, *target))
        return None
    return target
