"""The one table of targets (``table.TARGETS``) and what is derived from it.

table    -> one literal row per target: name, help, environment (a row of ``guard.envs.registry``: the
            library and its version), cites, mapping, writer (``--to``), worker side and loads (``--against``)
mappings -> the mappings of the stacks that read HF files themselves (tunix, keras-hub, EasyDeL), as data
maxtext  -> MaxText's own layout, one row per architecture, as data
doc      -> docs/jax.md's table of targets, generated (``python -m guard.targets``)

The steps a mapping names are interpreted in one place, ``guard.convert.steps``.  Nothing here imports
above ``guard.envs``: writers, sides and a target's causes are dotted strings, imported by ``guard.lazy.resolve``.
"""

from __future__ import annotations

from guard.targets.table import TARGETS, Load, Target

__all__ = ["TARGETS", "Load", "Target", "against_choices", "against_help", "to_choices", "to_help"]


def to_choices() -> tuple[str, ...]:
    """``convert --to``: every row with a writer."""
    return tuple(name for name, row in TARGETS.items() if row.writer)


def against_choices() -> tuple[str, ...]:
    """``parity --against``: every row whose side is run with loads."""
    return tuple(name for name, row in TARGETS.items() if row.side and row.loads)


def to_help() -> str:
    return "Target: " + "; ".join(f"{name}, {TARGETS[name].help}" for name in to_choices()) + "."


def against_help() -> str:
    stacks = "; ".join(f"{name}: {TARGETS[name].library} {TARGETS[name].version}" for name in against_choices())
    return (f"Instead of FLAX_DIR: load TORCH_DIR (an HF checkpoint; a stack with a layout of its own reads it "
            f"converted first, in a temporary directory) with that JAX stack's own loader, compare every parameter "
            f"it holds with the file and its forward with PyTorch's ({stacks}; their page: at the end of this help).")

