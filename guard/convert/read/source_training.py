"""Training checkpoints as conversion sources: which trainer's reader opens SRC, and where its config is.

``TRAINING_SOURCES`` is the literal registry, layout -> module; each module has
``find_checkpoint(src) -> (checkpoint, config folder) | None`` (names and small files only) and
``open_checkpoint(checkpoint) -> SourceModel`` (the consolidated model's tensors, read lazily; a
checkpoint with a problem gives its findings and no tensor, so nothing is written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard.convert.read.source import SourceModel
from guard.lazy import attribute
from guard.records import record

TRAINING_SOURCES: dict[str, str] = {
    "deepspeed": "guard.training.deepspeed.source",  # ZeRO 1-3: save folder with `latest`, or a tag folder
    "dcp": "guard.training.dcp.source",  # PyTorch Distributed Checkpoint: the folder with .metadata
}


# layout -> the adapters that give a trainer's own names as HF's, each ``(source, config) -> source`` (unchanged
# where the checkpoint is not its model; a layout it cannot map is refused with CG304 and no tensor)
NAME_ADAPTERS: dict[str, tuple[str, ...]] = {
    "dcp": ("guard.training.dcp.torchtitan.from_torchtitan",  # torchtitan's Llama: names and q/k RoPE order
            "guard.training.dcp.megatron.from_megatron"),  # Megatron-core GPT: layers unstacked, qkv/fc1 split
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


def adapt_names(layout: str, source: SourceModel, config: dict[str, Any] | None) -> SourceModel:
    """The layout's adapters in turn: the consolidated model under the names transformers loads."""
    for dotted in NAME_ADAPTERS.get(layout, ()):
        module, _, name = dotted.rpartition(".")
        source = attribute(module, name)(source, config)  # type: ignore[operator]
    return source
