"""Which directories are training checkpoints, and reading one into a FileScan.

``TRAINING_LAYOUTS`` is the literal registry: layout -> the module that claims and scans it (its
``claim`` and ``scan``; see ``guard.training``).  Discovery asks ``claim_training_dirs`` only for a
directory holding a name in ``guard.inventory.conventions.TRAINING_MARKERS``; a claim may take files
that would otherwise be read as weights of their own (the HF storage writer's safetensors shards).
"""

from __future__ import annotations

from guard.lazy import attribute
from guard.readers import unreadable
from guard.records import record
from guard.sources import BytesSource
from guard.tensors import FileScan

# layout -> module with ``claim(directory, names) -> TrainingDir | None`` and ``scan(found, *, name) -> FileScan``
TRAINING_LAYOUTS: dict[str, str] = {
    "dcp": "guard.training.dcp.dirs",  # PyTorch Distributed Checkpoint: .metadata, __R_N.distcp, HF writer shards
    "deepspeed": "guard.training.deepspeed.dirs",  # ZeRO 1-3: <tag>/*_model_states.pt, *_optim_states.pt; latest
    "megatron": "guard.training.dcp.megatron_dirs",  # Megatron's save folder: latest_checkpointed_iteration.txt (CG119)
}


@record
class TrainingDir:
    directory: str  # the checkpoint's directory, as discovery walks it
    layout: str  # a TRAINING_LAYOUTS key
    claimed: tuple[str, ...] = ()  # names in the directory that belong to the checkpoint, not read on their own
    parent_names: tuple[str, ...] = ()  # names beside the directory the layout needs (DeepSpeed's `latest`)


def claim_training_dirs(directory: str, names: frozenset[str]) -> tuple[TrainingDir, ...]:
    """Each layout that claims the directory (by names alone), in registry order."""
    found = []
    for layout, module in TRAINING_LAYOUTS.items():
        claim = attribute(module, "claim")(directory, names)  # type: ignore[operator]
        if claim is not None:
            found.append(claim)
    return tuple(found)


def scan_training_dir(found: TrainingDir, *, name: str) -> FileScan:
    """The layout's reader over the directory; an I/O failure is a one-line CG001 naming it."""
    scan = attribute(TRAINING_LAYOUTS[found.layout], "scan")
    try:
        return scan(found, name=name)  # type: ignore[operator,no-any-return]
    except OSError as exc:
        return unreadable(BytesSource(b"", name=name), f"read failed ({exc.strerror or exc})")
