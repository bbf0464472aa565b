"""Which directories are training checkpoints, and reading one into a FileScan.

Each trainer's row in ``guard.training.registry.TRAINERS`` names its ``claim`` and ``scan``.  Discovery asks
``claim_training_dirs`` only for a directory holding one of the rows' marker names
(``guard.training.registry.has_training_marker``); a claim may take files that would otherwise be read as
weights of their own (the HF storage writer's safetensors shards).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from guard.lazy import resolve
from guard.readers import unreadable
from guard.records import Record
from guard.sources import BytesSource
from guard.tensors import FileScan
from guard.training.registry import TRAINERS, trainer


class TrainingDir(Record):
    directory: str  # the checkpoint's directory, as discovery walks it
    layout: str  # its trainer's row (``Trainer.layout``)
    claimed: tuple[str, ...] = ()  # names in the directory that belong to the checkpoint, not read on their own
    parent_names: tuple[str, ...] = ()  # names beside the directory the layout needs (DeepSpeed's `latest`)


def _function(dotted: str) -> Callable[..., Any]:
    return cast("Callable[..., Any]", resolve(dotted))


def claim_training_dirs(directory: str, names: frozenset[str]) -> tuple[TrainingDir, ...]:
    """Each trainer that claims the directory (by names alone), in the table's order."""
    found = []
    for row in TRAINERS:
        claim = _function(row.claim)(directory, names)
        if claim is not None:
            found.append(claim)
    return tuple(found)


def scan_training_dir(found: TrainingDir, *, name: str) -> FileScan:
    """The trainer's reader over the directory; an I/O failure is a one-line CG001 naming it."""
    scan = _function(trainer(found.layout).scan)
    try:
        return cast(FileScan, scan(found, name=name))
    except OSError as exc:
        return unreadable(BytesSource(b"", name=name), f"read failed ({exc.strerror or exc})")
