"""Training checkpoints as conversion sources: which trainer's reader opens SRC, and where its config is.

A trainer's row in ``guard.training.registry.TRAINERS`` names its ``source``: a module with
``find_checkpoint(src) -> (checkpoint, config folder) | None`` (names and small files only) and
``open_checkpoint(checkpoint) -> SourceModel`` (the consolidated model's tensors, read lazily; a
checkpoint with a problem gives its findings and no tensor, so nothing is written), and its ``adapters``,
which give the trainer's own names as HF's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from guard.convert.read.source import SourceModel
from guard.lazy import resolve
from guard.records import Record
from guard.training.registry import TRAINERS, trainer


def _function(dotted: str) -> Callable[..., Any]:
    return cast("Callable[..., Any]", resolve(dotted))


class TrainingSource(Record):
    layout: str
    checkpoint: Path
    config_dir: Path  # where config.json and the tokenizer files are

    def open(self) -> SourceModel:
        return cast(SourceModel, _function(f"{trainer(self.layout).source}:open_checkpoint")(self.checkpoint))


def find_training_source(src: Path) -> TrainingSource | None:
    tried: set[str] = set()
    for row in TRAINERS:  # two rows may share a source (Megatron's torch_dist is DCP's): each is asked once
        if row.source is None or row.source in tried:
            continue
        tried.add(row.source)
        found = _function(f"{row.source}:find_checkpoint")(src)
        if found is not None:
            return TrainingSource(row.layout, found[0], found[1])
    return None


def adapt_names(layout: str, source: SourceModel, config: dict[str, Any] | None) -> SourceModel:
    """The adapters of every trainer whose checkpoints the layout's source opens, in turn: the consolidated
    model under the names transformers loads."""
    opened_by = trainer(layout).source
    for row in TRAINERS:
        if row.source == opened_by:
            for dotted in row.adapters:
                source = _function(dotted)(source, config)
    return source
