"""What the naming step decides: each tensor's target (``Mapped``), and the decisions the report lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guard.catalogue import make_finding
from guard.findings import Finding
from guard.write.plan import Mapped, SourceTensor

REASONS = {  # decision kind -> the words of the report
    "buffer": "buffer(s) the {target} class does not hold",
    "counter": "BatchNorm num_batches_tracked counter(s), which Flax does not keep (restored as 0 on the way back)",
    "computed": "frozen sinusoidal table(s) the {target} class computes itself",
    "head": "tensor(s) the {target} class has no place for (transformers drops them with a warning)",
    "tied": "tied alias(es), bit-identical to the tensor they share (transformers re-ties them on load)",
    "restored": "BatchNorm num_batches_tracked counter(s) Flax does not keep, written as 0 so PyTorch finds "
                "nothing missing",
    "restored_table": "frozen sinusoidal table(s) Flax computes, rebuilt with transformers' formula",
}


KEPT = ("tied", "restored", "restored_table")  # decisions that lose nothing


class Refusal(Exception):
    """The architecture cannot be named: one CG304 finding, nothing written."""

    def __init__(self, path: str, message: str, tensor: str | None = None, *, next_step: str | None = None) -> None:
        super().__init__(message)
        self.finding = make_finding("CG304", path, message, tensor=tensor)
        self.next_step = next_step  # what to do instead, where the code's generic advice would be wrong


@dataclass  # mutable: the name mapping appends tensors, findings, decisions and aliases as it maps
class Mapping:
    how: str
    architecture: str | None = None
    tensors: list[Mapped] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    decisions: dict[str, list[SourceTensor]] = field(default_factory=dict)
    aliases: list[Mapped] = field(default_factory=list)  # resolved later: tied alias, the tensor itself, or CG304

    def decide(self, kind: str, tensor: SourceTensor) -> None:
        self.decisions.setdefault(kind, []).append(tensor)

    @property
    def dropped(self) -> list[str]:
        return [t.name for kind, ts in self.decisions.items() if kind not in KEPT for t in ts]

    @property
    def tied(self) -> list[str]:
        return [t.name for t in self.decisions.get("tied", [])]

    def report(self, target: str) -> list[dict[str, Any]]:
        return [{"kind": kind, "reason": REASONS[kind].format(target=target), "count": len(ts),
                 "bytes": sum(t.info.nbytes or 0 for t in ts), "tensors": [t.name for t in ts]}
                for kind, ts in self.decisions.items()]
