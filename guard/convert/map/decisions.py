"""Decisions that need the data or the policy: tied aliases, and head tensors the target class lacks."""

from __future__ import annotations

from guard.catalogue import make_finding
from guard.convert.map.mapped import Mapping
from guard.findings import Finding, Severity


def resolve_aliases(mapping: Mapping, *, to: str) -> None:
    """A tied alias is dropped when bit-identical to a tensor of the same shape and dtype; with no such
    tensor at all it is the only copy (BartForCausalLM's decoder embedding) and is kept; else CG304."""
    import numpy as np

    from guard.write.bitviews import bits

    # input embeddings before output projections: with no other copy, the embedding is the one kept
    for candidate in sorted(mapping.aliases, key=lambda m: m.target[-1] == "kernel"):
        alias = candidate.source
        twins = [m.source for m in mapping.tensors
                 if m.source.info.shape == alias.info.shape and m.source.info.dtype == alias.info.dtype]
        if not twins:
            mapping.tensors.append(candidate)
            continue
        data = bits(alias.load())
        if any(np.array_equal(data, bits(t.load())) for t in twins):
            mapping.decide("tied", alias)
        else:
            mapping.findings.append(make_finding(
                "CG304", alias.info.file,
                f"{alias.name} {list(alias.info.shape)} is tied to another tensor in {mapping.architecture}, but no "
                f"tensor of the checkpoint holds the same values: {to} would lose it", tensor=alias.name))


def head_findings(mapping: Mapping, *, strict: bool) -> list[Finding]:
    """Tensors dropped because the target class has no place for them: a warning, or refused (--strict)."""
    dropped = mapping.decisions.get("head", [])
    if not dropped:
        return []
    names = ", ".join(f"{t.name} {list(t.info.shape)} ({t.info.nbytes or 0} bytes)" for t in dropped)
    total = sum(t.info.nbytes or 0 for t in dropped)
    verb = "refused (--strict): would drop" if strict else "dropped"
    finding = make_finding("CG304", dropped[0].info.file,
                           f"{verb} {len(dropped)} tensor(s), {total} bytes, that {mapping.architecture} has no "
                           f"place for: {names}", tensor=dropped[0].name)
    return [finding if strict else finding._replace(severity=Severity.warning)]
