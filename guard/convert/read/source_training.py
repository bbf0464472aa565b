"""Training checkpoints as conversion sources: which trainer's reader opens SRC, and where its config is.

``TRAINING_SOURCES`` is the literal registry, layout -> module; each module has
``find_checkpoint(src) -> (checkpoint, config folder) | None`` (names and small files only) and
``open_checkpoint(checkpoint) -> SourceModel`` (the consolidated model's tensors, read lazily; a
checkpoint with a problem gives its findings and no tensor, so nothing is written).
"""

from __future__ import annotations

from pathlib import Path

from guard.convert.read.source import SourceModel
from guard.lazy import attribute
from guard.records import record

TRAINING_SOURCES: dict[str, str] = {
    "deepspeed": "guard.training.deepspeed.source",  # ZeRO 1-3: save folder with `latest`, or a tag folder
    "dcp": "guard.training.dcp.source",  # PyTorch Distributed Checkpoint: the folder with .metadata
}


@record
class TrainingSource:
    layout: str
    checkpoint: Path
    config_dir: Path  # where config.json and the tokenizer files are

    def open(self) -> SourceModel:
        return attribute(TRAINING_SOURCES[self.layout], "open_checkpoint")(self.checkpoint)  # type: ignore[no-any-return,operator]


def find_training_source(src: Path) -> TrainingSource | None:
    for layout, module in TRAINING_SOURCES.items():
        found = attribute(module, "find_checkpoint")(src)  # type: ignore[operator]
        if found is not None:
            return TrainingSource(layout, found[0], found[1])
    return None
