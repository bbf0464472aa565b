"""What each DCP item is (module weight, optimizer state, other state) and the model's own key for it.

A state dict's nesting says which container an item sits in (``planner_data``: the path through the
nested dicts).  The DCP tutorial and Accelerate nest the model under ``model`` (keys ``model.<key>``);
torchtitan puts the model's keys at the top level beside ``optimizer``, ``lr_scheduler``, ``dataloader``
and ``train_state``; FSDP2's ``get_state_dict`` optimizer is ``optim.state.<fqn>.exp_avg``.
"""

from __future__ import annotations

from collections.abc import Iterable

from guard.training.dcp.layout import DcpItem, DcpMetadata
from guard.training.state import TrainingState, count_homes, model_key
from guard.tensors import TensorInfo

MODEL_CONTAINERS = frozenset({"model", "models", "module", "app"})  # {"model": ...}; torchtitan's ModelWrapper
OPTIMIZER_CONTAINERS = frozenset({"optim", "optimizer", "optimizers", "optim_state", "optimizer_state"})
STATE_CONTAINERS = frozenset({"lr_scheduler", "lr_schedulers", "scheduler", "dataloader", "train_state", "rng",
                              "rng_state", "extra_state", "common_state", "ema", "trainer_state", "scaler"})
TORCHTITAN_KEYS = frozenset({"train_state", "dataloader", "lr_scheduler"})


def item_role(item: DcpItem) -> tuple[str, str]:
    """(kind, the model's key) of one item; the key is only meaningful for module weights."""
    path = item.path or tuple(item.fqn.split("."))
    head = path[0]
    if head in OPTIMIZER_CONTAINERS and len(path) > 1:
        return "optimizer", item.fqn
    if head in STATE_CONTAINERS:
        return "other", item.fqn
    if item.path and len(item.path) == 1:  # a key of the top-level dict: the model's own (torchtitan)
        return "module", model_key(item.path)
    if head in MODEL_CONTAINERS and len(path) > 1:
        return "module", model_key(path[1:]) if item.path else model_key((item.fqn.partition(".")[2],))
    if not item.path:  # no planner_data: the fqn is all there is
        return "module", model_key((item.fqn,))
    return "other", item.fqn


def trainer_of(meta: DcpMetadata, heads: Iterable[str], *, folder: str, beside: frozenset[str]) -> str:
    """Who wrote it, as far as names say; torch.distributed.checkpoint where nothing more is known."""
    if "metadata.json" in beside or "common.pt" in beside:
        return "Megatron-core (torch_dist)"
    if folder.startswith(("pytorch_model_fsdp", "optimizer_")):
        return "Accelerate (FSDP SHARDED_STATE_DICT)"
    if TORCHTITAN_KEYS <= set(heads):
        return "torchtitan"
    return "torch.distributed.checkpoint"


def build_state(meta: DcpMetadata, *, path: str, folder: str, beside: frozenset[str], fmt: str = "dcp"
                ) -> TrainingState:
    weights: list[TensorInfo] = []
    seen: set[str] = set()
    kinds: list[tuple[str, str, int]] = []
    heads: set[str] = set()
    items: list[str] = []
    for item in meta.items:
        heads.add((item.path or (item.fqn,))[0])
        if item.shape is None or item.dtype is None:
            items.append(item.fqn)
            continue
        kind, key = item_role(item)
        tensor = TensorInfo(key if kind == "module" else item.fqn, item.dtype, item.shape, path)
        kinds.append((kind, item.dtype, tensor.numel))
        if kind == "module" and key not in seen:
            seen.add(key)
            weights.append(tensor)
    items += [f"{n} (Megatron-core's non-sharded state)" for n in ("common.pt",) if n in beside]
    files = sorted({e.file for e in meta.storage})
    ranks = {f[2:].split("_")[0] for f in files if f.startswith("__")}
    most = max((len(item.chunks) for item in meta.items), default=0)
    sharding = f"sharded: up to {most} chunks per tensor" if most > 1 else "unsharded: one chunk per tensor"
    return TrainingState(trainer_of(meta, heads, folder=folder, beside=beside), fmt, "dcp",
                         len(ranks) or None, sharding, tuple(weights), "module", count_homes(kinds), tuple(items),
                         tuple(files))
