"""CG122: a published weight set beside training state, narrower than the weights the training state holds.

A bf16 ``model.safetensors`` in the folder of a training checkpoint (or the folder above it: the Trainer's
``checkpoint-N/`` holds ``global_stepN/``, Accelerate's output holds ``pytorch_model_fsdp_0/``) whose master
weights are fp32 publishes less than the run trained.  The scan notes each model's primary weights and
its training sets (``guard.rules.publishing.PublishingCheck`` keeps those), and pairs them at the end.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from guard import dtypes
from guard.catalogue import make_finding
from guard.findings import Finding
from guard.training.state import KINDS

if TYPE_CHECKING:
    from guard.tensors import FileScan


class TrainingSet(Protocol):
    """A training checkpoint's weight set (guard.inventory.sets.WeightSet, a layer above this one)."""

    @property
    def files(self) -> Sequence[FileScan]: ...

    def parameters_by_dtype(self) -> dict[str, int]: ...


def narrower_findings(training: Iterable[TrainingSet], weights: Iterable[tuple[str, str, str]]) -> Iterator[Finding]:
    """CG122 for each primary weight set in a training set's folder, or the folder above it, narrower than it."""
    published = {directory: (dtype, file) for directory, dtype, file in weights}
    for ws in training:
        state = ws.files[0].training
        assert state is not None  # a training set's first file carries its claim (PublishingCheck keeps those)
        floats = {c: n for c, n in ws.parameters_by_dtype().items() if dtypes.is_float(c)}
        if not floats:
            continue
        masters = max(floats, key=floats.__getitem__)
        path = ws.files[0].path
        directory = posixpath.dirname(path.rstrip("/")) or "."
        for folder in dict.fromkeys((path.rstrip("/"), directory)):  # its own folder, and the one above it
            if folder not in published or not _narrower(published[folder][0], masters):
                continue
            dtype, file = published[folder]
            shown = dtypes.display_name
            yield make_finding(
                "CG122", file,
                f"{shown(dtype)} weights published beside the training state {path}, whose "
                f"{KINDS.get(state.publishes, 'weights')} are {shown(masters)}: the published copy is narrower than "
                f"what the run trained. To publish those: ckpt-guard convert {path} --to torch --out "
                f"{path.rstrip('/')}-{shown(masters)}")


def _narrower(published: str, masters: str) -> bool:
    a, b = dtypes.DTYPES.get(published), dtypes.DTYPES.get(masters)
    return a is not None and b is not None and a.bits < b.bits
