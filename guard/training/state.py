"""The record of one training checkpoint, and the FileScan the scan pipeline sees of it.

``TrainingState`` is what every trainer's reader returns (see ``guard.training``'s docstring): the
model's logical tensors as ``TensorInfo`` (global shapes; ``file`` the checkpoint as displayed; no
byte range, as they are spread over ranks), the dtype they would be published in, and where each
dtype of the training state lives.  ``training_scan`` wraps it for the inventory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from guard import dtypes
from guard.findings import Finding
from guard.records import Record
from guard.tensors import FileScan, TensorInfo

# What each kind of tensor is, as the reports say it.
KINDS: dict[str, str] = {
    # the state dict the model itself holds (FSDP2's sharded params, ZeRO's 16-bit `module`)
    "module": "module weights",
    # the optimizer's own full-precision copy (ZeRO's fp32 partitions, Megatron's fp32_param)
    "master": "master weights",
    "optimizer": "optimizer state",  # moments (exp_avg, exp_avg_sq), step counters
    "other": "other state",  # tensors of neither (an EMA copy, a scheduler's tensors, dataloader state)
}
# Names a trainer puts before the model's own keys; each is stripped where it leads a key (torch.compile's
# `_orig_mod.`, DDP's and DeepSpeed's `module.`).  A `model.` container is told by the state dict's nesting
# (DCP's planner_data), never by the string: the HF models' own keys start with `model.`.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")


class DtypeHome(Record):
    """Where one dtype lives: e.g. ("module", "BF16", 291, 1_034_752)."""

    kind: str  # a KINDS key
    dtype: str  # a safetensors code
    tensors: int
    elements: int

    def describe(self) -> str:
        return f"{KINDS.get(self.kind, self.kind)} {dtypes.display_name(self.dtype)}"


class TrainingState(Record):
    """One training checkpoint, read from its metadata (never by executing a pickle)."""

    trainer: str  # who wrote it, as far as the files tell: "torch.distributed.checkpoint", "FSDP2", "DeepSpeed", ...
    format: str  # "dcp", "dcp-safetensors" (HuggingFaceStorageWriter), "zero", "megatron-torch_dist", ...
    layout: str  # the set's layout: a guard.training.dirs.TRAINING_LAYOUTS key
    world_size: int | None  # ranks that wrote it (None where the files do not say)
    sharding: str  # "FSDP (dim 0 over 2 ranks)", "ZeRO-2", "replicated", ...
    weights: tuple[TensorInfo, ...]  # the model's logical tensors, in the dtype it would publish
    publishes: str  # the KINDS key of ``weights``: "master" where masters exist, else "module"
    homes: tuple[DtypeHome, ...] = ()  # every tensor of the training state, grouped by kind and dtype
    items: tuple[str, ...] = ()  # non-tensor items (lr, step, train state), by name: listed, never unpickled
    files: tuple[str, ...] = ()  # its data files, relative to the checkpoint

    @property
    def parameters(self) -> int:
        """What ``model.num_parameters()`` says: the floating logical tensors' elements (buffers saved in the
        state dict count too: the files do not tell them apart)."""
        return sum(t.numel for t in self.weights if dtypes.is_float(t.dtype))

    def notes(self) -> dict[str, str]:
        """The ``FileScan.metadata`` lines the report shows for the set (each under 120 characters)."""
        ranks = f", world size {self.world_size}" if self.world_size else ""
        found = {"training.what": f"{self.trainer} ({self.format}){ranks}, {self.sharding}",
                 "training.dtypes": "; ".join(f"{h.describe()} ({h.tensors} tensors)" for h in self.homes)[:119],
                 "training.publishes": f"publishes the {KINDS[self.publishes]}: {len(self.weights)} tensors, "
                                       f"{self.parameters:,} parameters" if self.weights else
                                       "publishes no weights: no model tensor in it (optimizer or other state "
                                       "only, as Accelerate's optimizer_0/)"}
        if self.files:  # its data files (a DCP's __0_0.distcp, ZeRO's rank files): named where they are few
            named = ": " + ", ".join(self.files) if len(self.files) <= 3 else ""
            found["training.files"] = f"{len(self.files)} data file(s){named}"[:119]
        if self.items:  # named where they are few: a whole optimizer's param groups would drown the line
            named = ": " + ", ".join(self.items) if len(self.items) <= 3 else ""
            found["training.items"] = f"{len(self.items)} non-tensor item(s), not unpickled{named}"[:119]
        return found


def count_homes(kinds: Iterable[tuple[str, str, int]]) -> tuple[DtypeHome, ...]:
    """(kind, dtype, elements) per tensor -> one DtypeHome per kind and dtype, in order of first appearance."""
    counts: dict[tuple[str, str], list[int]] = {}
    for kind, dtype, elements in kinds:
        tally = counts.setdefault((kind, dtype), [0, 0])
        tally[0] += 1
        tally[1] += elements
    order = list(KINDS)
    return tuple(DtypeHome(kind, dtype, n, elements) for (kind, dtype), (n, elements)
                 in sorted(counts.items(), key=lambda item: order.index(item[0][0]) if item[0][0] in order else 9))


def model_key(path: Sequence[str]) -> str:
    """The model's own key for a state dict path: the container's name dropped, wrapper prefixes stripped."""
    key = ".".join(path)
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key, stripped = key[len(prefix):], True
    return key.replace("._orig_mod.", ".")


def training_scan(state: TrainingState, *, path: str, fmt: str, size: int, findings: Sequence[Finding] = (),
                  bytes_read: int = 0, metadata: Mapping[str, str] | None = None) -> FileScan:
    """The FileScan the inventory groups: the logical weights as its tensors, the record beside them."""
    notes = {**state.notes(), **(metadata or {})}
    return FileScan(path=path, format=fmt, size=size, tensors=state.weights, findings=tuple(findings),
                    metadata=MappingProxyType(notes), bytes_read=bytes_read, training=state)
