"""The stacks ``parity --against`` checks: the rows of the one table of targets (``guard.targets.table``)
whose worker side is run with loads.  A row names the library (through its environment), the loads, the
mapping from a Hugging Face tensor to the parameter the library holds, as data, and what it cites."""

from __future__ import annotations

from typing import Any

from guard.targets import TARGETS as ALL_TARGETS, against_choices
from guard.targets.table import Load, Target

__all__ = ["TARGETS", "Load", "Target", "head_dim"]

TARGETS: dict[str, Target] = {name: ALL_TARGETS[name] for name in against_choices()}


def head_dim(config: dict[str, Any]) -> int:
    explicit = config.get("head_dim")
    if isinstance(explicit, int):
        return explicit
    return int(config["hidden_size"]) // int(config["num_attention_heads"])
