"""What each DCP item is (module weight, optimizer state, other state) and the model's own key for it.

A state dict's nesting says which container an item sits in (``planner_data``: the path through the
nested dicts).  The DCP tutorial and Accelerate nest the model under ``model`` (keys ``model.<key>``);
torchtitan puts the model's keys at the top level beside ``optimizer``, ``lr_scheduler``, ``dataloader``
and ``train_state``; FSDP2's ``get_state_dict`` optimizer is ``optim.state.<fqn>.exp_avg``.
"""

from __future__ import annotations

from collections.abc import Iterable

from guard.tensors import TensorInfo
from guard.training.dcp.layout import DcpItem, DcpMetadata
from guard.training.state import TrainingState, count_homes, model_key

MODEL_CONTAINERS = frozenset({"model", "models", "module", "app"})  # {"model": ...}; torchtitan's ModelWrapper
OPTIMIZER_CONTAINERS = frozenset({"optim", "optimizer", "optimizers", "optim_state", "optimizer_state"})
STATE_CONTAINERS = frozenset({"lr_scheduler", "lr_schedulers", "scheduler", "dataloader", "train_state", "rng",
                              "rng_state", "extra_state", "common_state", "ema", "trainer_state", "scaler"})
TORCHTITAN_KEYS = frozenset({"train_state", "dataloader", "lr_scheduler"})
# Megatron-core's fp32 masters: Float16OptimizerWithFloat16Params (and the distributed optimizer's fully
# reshardable layout) save each as `optimizer.state.fp32_param.<the model's key>`, its moments beside them.
MEGATRON_MASTERS = "optimizer.state.fp32_param."


def item_role(item: DcpItem) -> tuple[str, str]:
    """(kind, the model's key) of one item; the key is only meaningful for module weights."""
    path = item.path or tuple(item.fqn.split("."))
    head = path[0]
    if item.fqn.startswith(MEGATRON_MASTERS) and len(item.fqn) > len(MEGATRON_MASTERS):
        return "master", item.fqn[len(MEGATRON_MASTERS):]
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


def publish_kind(meta: DcpMetadata) -> str:
    """What the checkpoint would publish: the master weights where it holds them, else the module weights."""
    tensors = (item for item in meta.items if item.shape is not None and item.dtype is not None)
    return "master" if any(item_role(item)[0] == "master" for item in tensors) else "module"


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
    found: dict[str, list[TensorInfo]] = {"module": [], "master": []}  # the model's tensors, as each kind holds them
    seen: set[tuple[str, str]] = set()
    kinds: list[tuple[str, str, int]] = []
    heads: set[str] = set()
    items: list[str] = []
    for item in meta.items:
        heads.add((item.path or (item.fqn,))[0])
        if item.shape is None or item.dtype is None:
            items.append(item.fqn)
            continue
        kind, key = item_role(item)
        tensor = TensorInfo(key if kind in found else item.fqn, item.dtype, item.shape, path)
        kinds.append((kind, item.dtype, tensor.numel))
        if kind in found and (kind, key) not in seen:
            seen.add((kind, key))
            found[kind].append(tensor)
    items += [f"{n} (Megatron-core's non-sharded state)" for n in ("common.pt",) if n in beside]
    files = sorted({e.file for e in meta.storage})
    ranks = {f[2:].split("_")[0] for f in files if f.startswith("__")}
    most = max((len(item.chunks) for item in meta.items), default=0)
    sharding = f"sharded: up to {most} chunks per tensor" if most > 1 else "unsharded: one chunk per tensor"
    publishes = publish_kind(meta)
    weights = found[publishes]
    trainer = trainer_of(meta, heads, folder=folder, beside=beside)
    if trainer.startswith("Megatron"):  # its layers' weights stacked on a leading axis: say how many
        stacked = sorted({t.shape[0] for t in weights if t.name.startswith("decoder.layers.") and t.shape
                          and not t.name.split(".")[2].isdigit()})
        if stacked:
            sharding = f"{'/'.join(map(str, stacked))} layers stacked, up to {most} chunks per tensor"
    return TrainingState(trainer, fmt, "dcp", len(ranks) or None, sharding, tuple(weights), publishes,
                         count_homes(kinds), tuple(items), tuple(files))
