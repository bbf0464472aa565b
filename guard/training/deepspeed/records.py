"""The walked pickles of a ZeRO checkpoint as plain records (``engine.py`` and ``stage_1_and_2.py`` / ``stage3.py``
of DeepSpeed 0.19 name the keys).  A structure DeepSpeed would not have written is a MalformedCheckpoint
(CG001 naming the file); tensors stay descriptions with byte ranges, never read here.
"""

from __future__ import annotations

from guard.errors import MalformedCheckpoint
from guard.readers.torch.pickle import DictDesc, TensorRef
from guard.records import Record
from guard.tensors import TensorInfo
from guard.training.deepspeed.files import ZeroFile
from guard.training.pickles import InertRecord

_MAX_DIMS = 64


class ModelStates(Record):
    """``*_model_states.pt``: the 16-bit module (ZeRO-3: zero-size placeholders) and the shapes that order the
    masters."""

    path: str
    module: tuple[TensorInfo, ...]  # the state dict as the engine saved it, names as the model's own
    param_shapes: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]  # per param group, in flattening order
    frozen_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    frozen_fragments: tuple[TensorInfo, ...]
    buffer_names: tuple[str, ...]
    shared: tuple[tuple[str, str], ...]  # (alias, the name it shares)
    dp_world_size: int | None
    mp_world_size: int | None
    stage: int | None  # ds_config's zero_optimization.stage
    version: str | None
    items: tuple[str, ...]  # the non-tensor entries, by name
    bf16: bool = False  # ds_config's bf16.enabled: the optimizer files are then named bf16_...


class OptimStates(Record):
    """``*_optim_states.pt``: this rank's flat fp32 (or bf16) master partition per group and its moments."""

    path: str
    stage: int
    partition_count: int
    masters: tuple[TensorInfo, ...]  # one flat partition per param group
    alignment_paddings: tuple[tuple[int, ...], ...] | None  # 0.19.8: per group, per parameter
    moments: tuple[TensorInfo, ...]  # exp_avg, exp_avg_sq, step...: counted, never read
    loss_scaler: str | None


def _fields(desc: object, what: str) -> dict[str, object]:
    if not isinstance(desc, DictDesc):
        raise MalformedCheckpoint(f"{what} is a {type(desc).__name__}, not a dict")
    return {k: v for k, v in desc.items if isinstance(k, str)}


def _int(value: object, what: str) -> int:
    if isinstance(value, InertRecord) and value.args:  # ZeroStageEnum(2)
        value = value.args[0]
    if type(value) is not int or value < 0:
        raise MalformedCheckpoint(f"{what} is not a non-negative integer")
    return value


def _shape(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > _MAX_DIMS or not all(type(v) is int and v >= 0
                                                                                    for v in value):
        raise MalformedCheckpoint(f"{what} is not a shape")
    return tuple(value)


def _shapes(value: object, what: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if value is None:
        return ()
    return tuple((name, _shape(shape, f"{what} {name!r}")) for name, shape in _fields(value, what).items())


def _tensors(file: ZeroFile, value: object, what: str) -> tuple[TensorInfo, ...]:
    if value is None:
        return ()
    out = []
    for name, ref in _fields(value, what).items():
        if isinstance(ref, TensorRef):
            out.append(file.tensor(name, ref))
    return tuple(out)


def read_model_states(file: ZeroFile) -> ModelStates:
    top = _fields(file.root, "the model states")
    if "module" not in top or "param_shapes" not in top:
        raise MalformedCheckpoint("holds no 'module' and 'param_shapes': not DeepSpeed model states")
    groups = top["param_shapes"]
    groups = [groups] if isinstance(groups, DictDesc) else groups  # very old DeepSpeed: one dict
    if not isinstance(groups, list):
        raise MalformedCheckpoint("param_shapes is not a list of dicts")
    buffers = top.get("buffer_names") or []
    shared = _fields(top.get("shared_params") or DictDesc(), "shared_params")
    config = top.get("ds_config")
    stage: int | None = None
    bf16 = False
    if isinstance(config, DictDesc):
        zero = _fields(config, "ds_config").get("zero_optimization")
        value = _fields(zero, "zero_optimization").get("stage") if isinstance(zero, DictDesc) else None
        if type(value) is int:
            stage = value
        half = _fields(config, "ds_config").get("bf16")
        bf16 = isinstance(half, DictDesc) and _fields(half, "bf16").get("enabled") is True
    version = top.get("ds_version")
    return ModelStates(
        file.path, _tensors(file, top["module"], "module"),
        tuple(_shapes(group, "param_shapes") for group in groups),
        _shapes(top.get("frozen_param_shapes"), "frozen_param_shapes"),
        _tensors(file, top.get("frozen_param_fragments"), "frozen_param_fragments"),
        tuple(str(b) for b in buffers) if isinstance(buffers, list) else (),
        tuple((k, v) for k, v in shared.items() if isinstance(v, str)),
        _optional_int(top.get("dp_world_size")), _optional_int(top.get("mp_world_size")), stage,
        version if isinstance(version, str) else None,
        tuple(k for k, v in top.items() if k not in ("module", "param_shapes", "frozen_param_shapes",
                                                         "frozen_param_fragments", "buffer_names", "shared_params")
              and v is not None),
        bf16,
    )


def _optional_int(value: object) -> int | None:
    return value if type(value) is int and value > 0 else None


def read_optim_states(file: ZeroFile) -> OptimStates:
    top = _fields(file.root, "the optimizer states")
    state = _fields(top.get("optimizer_state_dict"), "optimizer_state_dict")
    if "zero_stage" not in state or "partition_count" not in state:
        raise MalformedCheckpoint("optimizer_state_dict has no zero_stage and partition_count: not a ZeRO checkpoint")
    stage = _int(state["zero_stage"], "zero_stage")
    counts = state["partition_count"]
    count = max((_int(c, "partition_count") for c in counts), default=0) if isinstance(counts, list) else \
        _int(counts, "partition_count")
    key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
    flat = state.get(key)
    if not isinstance(flat, list) or not all(isinstance(t, TensorRef) for t in flat):
        raise MalformedCheckpoint(f"{key} is not a list of tensors (ZeRO stage {stage})")
    masters = tuple(file.tensor(f"{key}.{i}", ref) for i, ref in enumerate(flat))
    paddings = state.get("param_alignment_paddings")
    alignment = None
    if isinstance(paddings, list):
        alignment = tuple(tuple(_int(p, "param_alignment_paddings") for p in group) if isinstance(group, list)
                          else () for group in paddings)
    base = state.get("optimizer_state_dict" if stage == 3 else "base_optimizer_state")
    moments: list[TensorInfo] = []
    if isinstance(base, DictDesc):
        per_param = _fields(base, "optimizer state").get("state")
        for index, slots in (per_param.items if isinstance(per_param, DictDesc) else []):
            for slot, ref in (slots.items if isinstance(slots, DictDesc) else []):
                if isinstance(ref, TensorRef):
                    moments.append(file.tensor(f"state.{index}.{slot}", ref))
    scaler = state.get("loss_scaler")
    return OptimStates(file.path, stage, count, masters, alignment, tuple(moments),
                       scaler.name if isinstance(scaler, InertRecord) else None)
