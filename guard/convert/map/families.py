"""The architectures transformers 4.x has in both PyTorch and Flax: the flax and torch targets' mapping,
one row per model_type in the one table of targets' package (``guard.targets.families``)."""

from __future__ import annotations

from guard.targets.families import ALIASES, FAMILIES, FLAX_NAMES, Family

__all__ = ["ALIASES", "FAMILIES", "FLAX_NAMES", "Family"]
