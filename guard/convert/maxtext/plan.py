"""A source model against a MaxText row: every leaf of MaxText's tree with the HF tensors it is built from.

Sizes come from config.json (MaxText's own converter reads them from its hard-coded
``HF_MODEL_CONFIGS[model_name]`` instead, which is why ``flags`` prints them).  Each leaf
lists its sources on a grid: none for a global or unscanned parameter, the expert axis
(0) for MoE experts, ``param_scan_axis`` (1) for scanned layers, both (experts first,
MaxText's ``_build_multi_axis_stacked_tensor``) for scanned experts.
"""

from __future__ import annotations

from math import prod
from typing import Any

from guard.catalogue import make_finding
from guard.convert.maxtext.refusals import unsupported_layouts
from guard.convert.maxtext.source_config import dimensions, rope_type, tied
from guard.findings import Finding
from guard.records import Record
from guard.targets.maxtext import ARCHITECTURES, PARAM_SCAN_AXIS, Architecture, Param

ROOT = ("params", "params")
Spec = tuple[tuple[str, ...], tuple[tuple[tuple[int, ...], str], ...], tuple[int, ...]]  # (key, grid, stacked axes)


class Leaf(Record):
    key: tuple[str, ...]  # the Orbax key, ROOT first
    param: Param
    grid: tuple[tuple[tuple[int, ...], str], ...]  # (index on the stacked axes, HF tensor name)
    axes: tuple[int, ...]  # where the grid's axes sit in the MaxText array
    piece: tuple[int, ...]  # one HF tensor's shape once through the steps
    dtype: str  # the source dtype (a safetensors code)

    @property
    def name(self) -> str:
        return "/".join(self.key[len(ROOT):])

    @property
    def shape(self) -> tuple[int, ...]:
        counts = [max(i[d] for i, _ in self.grid) + 1 for d in range(len(self.axes))]
        shape = list(self.piece)
        for axis, count in zip(self.axes, counts):
            shape.insert(axis, count)
        return tuple(shape)

    def place(self, at: tuple[int, ...]) -> tuple[Any, ...]:
        """The numpy index of one HF tensor's place in the MaxText array."""
        index: list[Any] = [slice(None)] * (len(self.piece) + len(self.axes))
        for axis, i in zip(self.axes, at):
            index[axis] = i
        return tuple(index)


def choose_row(config: dict[str, Any]) -> Architecture | None:
    model_type = config.get("model_type")
    if model_type == "llama":
        return ARCHITECTURES["llama3" if rope_type(config) == "llama3" else "llama"]
    return next((row for row in ARCHITECTURES.values() if model_type in row.model_types), None)


def plan_leaves(row: Architecture, config: dict[str, Any], tensors: dict[str, Any], *, scan: bool,
                path: str) -> tuple[list[Leaf], list[Finding]]:
    """Every MaxText leaf, or the CG304 findings that stop the conversion.  ``tensors``: name -> TensorInfo."""
    import numpy as np

    from guard.convert import steps as step_table

    try:
        dims = dimensions(config)
    except (KeyError, TypeError, ValueError) as exc:  # a size config.json lacks, or one that is not a number
        return [], [make_finding("CG304", path, f"config.json cannot give MaxText's sizes ({type(exc).__name__}: "
                                 f"{str(exc)[:100]}); check hidden_size, num_attention_heads, num_hidden_layers, "
                                 "vocab_size")]
    try:
        reasons = unsupported_layouts(row, config, dims)
    except (TypeError, ValueError) as exc:  # a setting the refusals read (RoPE, pattern, scalar) that is no number
        reasons = [f"config.json has a setting MaxText's {row.name} block reads that is not a number "
                   f"({type(exc).__name__}: {str(exc)[:100]})"]
    findings = [make_finding("CG304", path, f"model_type {config.get('model_type')!r}: {reason}") for reason in reasons]
    if findings:
        return [], findings
    leaves: list[Leaf] = []
    used: set[str] = set()
    for param in row.required(tied=tied(config)):
        specs = _leaf_specs(param, dims, scan=scan)
        if param.optional and specs[0][1][0][1] not in tensors:
            continue
        want = tuple(dims[s] for s in param.shape)
        piece = tuple(step_table.to_target(np.empty(want, np.uint8), param.steps, dims["H"]).shape)
        for key, grid, axes in specs:
            seen = set()
            for _, name in grid:
                used.add(name)
                info = tensors.get(name)
                if info is None:
                    findings.append(make_finding("CG304", path, f"{name} is missing: MaxText's {row.name} tree "
                                                 f"needs it for {'/'.join(key[len(ROOT):])}", tensor=name))
                elif tuple(info.shape) != want:
                    findings.append(make_finding("CG304", path, f"{name} has shape {list(info.shape)}, but "
                                                 f"config.json says {list(want)} ({' x '.join(param.shape)})",
                                                 tensor=name))
                else:
                    seen.add(info.dtype)
            if len(seen) > 1:
                findings.append(make_finding("CG304", path, f"{'/'.join(key[len(ROOT):])} stacks tensors of "
                                             f"{', '.join(sorted(seen))}; one leaf holds one dtype (convert "
                                             "with --dtype)", tensor=grid[0][1]))
            elif seen:
                leaves.append(Leaf(key, param, grid, axes, piece, seen.pop()))
    for name in sorted(set(tensors) - used):
        findings.append(make_finding("CG304", path, f"{name} has no place in MaxText's {row.name} tree", tensor=name))
    return ([] if findings else leaves), findings


def _leaf_specs(param: Param, dims: dict[str, int], *,
                scan: bool) -> list[tuple[tuple[str, ...], tuple[tuple[tuple[int, ...], str], ...], tuple[int, ...]]]:
    """(Orbax key, grid, stacked axes) of each leaf the parameter makes: one, or one per layer unscanned."""
    parts = tuple(param.maxtext.split("/"))
    if parts[0] != "layers":
        return [(ROOT + parts, (((), param.hf),), ())]
    experts = list(range(dims["E"])) if "{e}" in param.hf else [None]
    stride, offset = param.layer  # MaxText layer i holds HF layer stride * i + offset (Gemma 2: pairs)

    def grid(layers: range, stacked: bool) -> tuple[tuple[tuple[int, ...], str], ...]:
        return tuple((tuple(x for x in (e, i if stacked else None) if x is not None),
                      param.hf.format(i=stride * i + offset, e=e)) for e in experts for i in layers)

    expert_axes = (0,) if experts != [None] else ()
    layers = dims["L"] // stride
    if scan and param.block:
        return _block_specs(param, parts, dims["L"])
    if scan:  # experts lead (0), layers next (1); without experts, layers on param_scan_axis
        axes = expert_axes + ((1 if expert_axes else PARAM_SCAN_AXIS),)
        return [(ROOT + ("decoder",) + parts, grid(range(layers), True), axes)]
    return [(ROOT + ("decoder", f"layers_{i}") + parts[1:], grid(range(i, i + 1), False), expert_axes)
            for i in range(layers)]


def _block_specs(param: Param, parts: tuple[str, ...], layers: int) -> list[Spec]:
    """Gemma 3 scanned (nnx_decoders.py _init_scanned_gemma3): decoder/layers/layers_{k} stacks HF layers
    block * j + k on param_scan_axis over the full blocks j; the layers after the last full block sit unstacked
    in decoder/layers_remainder/layers_{r} (none stacked when there are fewer layers than one block)."""
    block = param.block
    full = layers // block
    specs: list[Spec] = [(ROOT + ("decoder", "layers", f"layers_{k}") + parts[1:],
              tuple(((j,), param.hf.format(i=block * j + k)) for j in range(full)), (PARAM_SCAN_AXIS,))
             for k in range(block) if full]
    specs += [(ROOT + ("decoder", "layers_remainder", f"layers_{r}") + parts[1:],
               (((), param.hf.format(i=block * full + r)),), ()) for r in range(layers % block)]
    return specs


def leaf_bytes(leaf: Leaf, itemsize: int) -> int:
    return prod(leaf.shape) * itemsize
