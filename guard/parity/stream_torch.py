"""The PyTorch side, streamed: transformers' own forward pass, one block's weights in memory at a time.

The model is built by its class with every parameter on the meta device (buffers, such as
rotary frequencies, are real), so it costs no memory.  What is not in a block (embeddings,
final norm, head) is loaded once; each block (an element of an ``nn.ModuleList``: the layers
of a decoder, an encoder, a ResNet's stages) loads its weights from the checkpoint in a
forward pre-hook and drops them in the forward hook, which also keeps its output and the
outputs of its direct children (``model.layers.3.self_attn``) for ``guard.parity.located``.

Casting follows ``from_pretrained``: each tensor to the dtype the model built it in, fp32 for
the class's keep-in-fp32 modules.  Anything not placed exactly is ``NotStreamable``.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from guard.parity.runs import tables_in_fp32, torch_dtype_of, torch_forward
from guard.parity.weights import CheckpointWeights, NotStreamable, to_torch


def stream_torch(cls: Any, config: Any, directory: Path, dtype: str, inputs: dict[str, Any], *,
                 leaves: bool) -> tuple[dict[str, Any], dict[str, Any], list[str], list[str]]:
    """(outputs, module outputs in the order they finished, block names, leaf units).

    ``leaves``: the large modules outside the blocks that own parameters and have no such children
    (embeddings, head: ``leaf_units``) stream too, so no vocabulary-sized matrix stays resident."""
    torch_dtype = torch_dtype_of(dtype)
    weights = CheckpointWeights(directory, "torch", separator=".")
    model = skeleton(cls, config, torch_dtype)
    blocks = find_blocks(model)
    if not blocks:
        raise NotStreamable("no repeated blocks (nn.ModuleList) to stream")
    units = blocks + (leaf_units(model, blocks) if leaves else [])
    slots = _slots(model, weights, _keep_in_fp32(model, torch_dtype))
    per_unit = _by_unit(slots, blocks, set(units))
    streamed = {id(s) for unit_slots in per_unit.values() for s in unit_slots}
    for slot in slots:
        if id(slot) not in streamed:
            _place(model, slot, weights.load(slot[1]))
    _load_buffers(model, weights)
    if dtype == "F32":
        tables_in_fp32(model)
    recorded: dict[str, Any] = {}
    loads = {b: 0 for b in blocks}
    handles = _hooks(model, blocks, per_unit, weights, recorded, loads)
    try:
        outputs = torch_forward(model, torch_dtype, inputs)
    except NotStreamable:
        raise
    except Exception as exc:  # meta weights touched outside their block, or the model itself fails: run it whole
        shown = str(exc).splitlines()[0][:200] if str(exc) else repr(exc)
        raise NotStreamable(f"streamed forward pass failed: {shown}") from exc
    finally:
        for handle in handles:
            handle.remove()
    if not all(loads.values()):
        raise NotStreamable(f"block {next(b for b, n in loads.items() if not n)} never ran")
    return outputs, recorded, blocks, units[len(blocks):]


def find_blocks(model: Any) -> list[str]:
    """Elements of the outermost ``nn.ModuleList``s that hold parameters, in module order."""
    import torch

    blocks: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or any(name.startswith(b + ".") for b in blocks):
            continue
        blocks += [f"{name}.{child}" for child, sub in module.named_children()
                   if next(sub.parameters(), None) is not None]
    return blocks


LEAF_ELEMENTS = 1 << 20  # a leaf this large streams (a vocabulary matrix); norms and biases stay resident


def leaf_units(model: Any, blocks: list[str]) -> list[str]:
    """Large modules outside the blocks (not the model itself) owning parameters, with no such children."""
    units = []
    for name, module in model.named_modules():
        if not name or _block_of(name, blocks) is not None or name in blocks:
            continue
        if type(module).__name__.endswith("SinusoidalPositionalEmbedding"):
            continue  # the fp32 pass recomputes it (tables_in_fp32): it must stay as computed
        own = sum(p.numel() for p in module._parameters.values() if p is not None)
        if own >= LEAF_ELEMENTS and all(next(child.parameters(), None) is None for child in module.children()):
            units.append(name)
    return units


def _by_unit(slots: list[Slot], blocks: list[str], units: set[str]) -> dict[str, list[Slot]]:
    """The slots each unit loads: a slot streams only if every tied name of it lies in a unit
    (wte and a tied lm_head each load it); one name outside keeps it resident."""
    per_unit: dict[str, list[Slot]] = {u: [] for u in units}
    for slot in slots:
        owners = {_block_of(n, blocks) or (n.rpartition(".")[0] if n.rpartition(".")[0] in units else None)
                  for n in slot[0]}
        named = {owner for owner in owners if owner is not None}
        if len(named) == len(owners):  # no None among them
            for owner in named:
                per_unit[owner].append(slot)
    return per_unit


@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    """Every parameter a constructor registers goes to the meta device; buffers stay real."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(self: Any, name: str, param: Any) -> None:
        register(self, name, param)
        if param is not None and param.device.type != "meta":  # a meta one is a tie (lm_head = wte): keep it
            self._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]  # restored below
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]  # the original back


def skeleton(cls: Any, config: Any, torch_dtype: Any) -> Any:
    try:  # transformers 5 moved it out of modeling_utils
        from transformers.initialization import no_init_weights
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # type: ignore[attr-defined, no-redef]  # 4.x's home

    try:
        with _params_on_meta(), no_init_weights():
            model = cls._from_config(copy.deepcopy(config), torch_dtype=torch_dtype, attn_implementation="eager")
        model.tie_weights()  # as from_pretrained does: no_init_weights skips it
    except Exception as exc:  # any constructor the meta device upsets: run it whole
        raise NotStreamable(f"{cls.__name__} cannot be built without weights: {exc!r}"[:300]) from None
    return model.eval()


Slot = tuple[list[str], str, Any, Any]  # (tied model names, stored name, target dtype, the meta parameter)


def _slots(model: Any, weights: CheckpointWeights, keep: re.Pattern[str] | None) -> list[Slot]:
    """One slot per parameter object (tied names share one), with the stored tensor it loads."""
    groups: dict[int, list[str]] = {}
    params: dict[int, Any] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
        params[id(param)] = param
    naming = weights.naming({n for names in groups.values() for n in names}, model.base_model_prefix)
    slots = []
    for key, names in groups.items():
        stored = next((naming[n] for n in names if naming[n] is not None), None)
        if stored is None:
            raise NotStreamable(f"{names[0]} is not in the checkpoint")
        if weights.shape(stored) != tuple(params[key].shape):
            raise NotStreamable(f"{stored} has shape {weights.shape(stored)}, the model {tuple(params[key].shape)}")
        fp32 = keep is not None and keep.search(names[0]) is not None
        slots.append((names, stored, _fp32() if fp32 else params[key].dtype, params[key]))
    return slots


def _fp32() -> Any:
    import torch

    return torch.float32


def _keep_in_fp32(model: Any, torch_dtype: Any) -> re.Pattern[str] | None:
    """transformers' rule: keep-in-fp32 modules under fp16, the strict ones under fp16 and bf16."""
    import torch

    modules = list(getattr(model, "_keep_in_fp32_modules", None) or []) if torch_dtype == torch.float16 else []
    if torch_dtype in (torch.float16, torch.bfloat16):
        modules += list(getattr(model, "_keep_in_fp32_modules_strict", None) or [])
    return re.compile("|".join(rf"((^|\.){re.escape(m)}($|\.))" for m in modules)) if modules else None


def _place(model: Any, slot: Slot, array: Any | None) -> None:
    """The loaded tensor into every tied name of the slot; ``None`` puts the meta parameter back."""
    import torch

    names, _stored, dtype, meta = slot
    param = meta if array is None else torch.nn.Parameter(to_torch(array, dtype), requires_grad=False)
    for name in names:
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._parameters[leaf] = param


def _load_buffers(model: Any, weights: CheckpointWeights) -> None:
    """Persistent buffers the checkpoint holds (BatchNorm statistics): small, all loaded up front."""
    buffers = dict(model.named_buffers())
    naming = weights.naming(set(buffers), model.base_model_prefix)
    for name, buffer in buffers.items():
        stored = naming[name]
        if stored is not None and weights.shape(stored) == tuple(buffer.shape):
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner)._buffers[leaf] = to_torch(weights.load(stored), buffer.dtype)


def _block_of(name: str, blocks: list[str]) -> str | None:
    return next((b for b in blocks if name.startswith(b + ".")), None)


def _hooks(model: Any, blocks: list[str], per_unit: dict[str, list[Slot]], weights: CheckpointWeights,
           recorded: dict[str, Any], loads: dict[str, int]) -> list[Any]:
    handles = []
    for name, module in model.named_modules():
        block = _block_of(name, blocks)
        if name in per_unit:
            def load(_module: Any, _args: Any, name: str = name) -> None:
                if name in loads:
                    loads[name] += 1
                for slot in per_unit[name]:
                    _place(model, slot, weights.load(slot[1]))

            handles.append(module.register_forward_pre_hook(load))
        if block is None or "." not in name[len(block) + 1:]:  # blocks, their children, and what is not in one
            handles.append(module.register_forward_hook(_recorder(recorded, name)))
        if name in per_unit:
            def drop(_module: Any, _args: Any, _out: Any, name: str = name) -> None:
                for slot in per_unit[name]:
                    _place(model, slot, None)

            handles.append(module.register_forward_hook(drop))
    return handles


def _recorder(recorded: dict[str, Any], name: str) -> Any:
    def record(_module: Any, _args: Any, out: Any) -> None:
        first = first_array(out)
        if first is not None and name not in recorded:
            recorded[name] = first.detach().float().numpy()

    return record


def first_array(out: Any) -> Any:
    """A module's main output: itself, or the first item of its tuple / ModelOutput."""
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, tuple | list):
        out = out[0] if out else None
    return out if hasattr(out, "shape") and hasattr(out, "dtype") else None
