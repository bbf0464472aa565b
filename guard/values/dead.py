"""Dead weights (CG207): weight matrices whose every value is zero, or one constant, reported by group.

microsoft/BitNet#608: every MLP weight of a published model was zero, and every re-upload (GGUF, U8,
bf16) inherited them; the headers were sound and the model loaded.  Only the values show it.

Cheap on a healthy model: a tensor is read from its start only while its values stay uniform, so a
trained matrix costs one small read (two different values in its first 4 KiB), and only a dead one is
read whole.  The findings are grouped ("the mlp weights of layers 0–29 are all zero"): a model with
one dead module per layer gets a finding per module kind, not one per tensor.

What is not reported, as legitimately uniform:
- tensors that are not matrices: fewer than two dimensions larger than one (norm weights, layer
  scales, gates and tokens stored as ``(1, 1, d)``, a ConvNeXt-V2 GRN's ``(1, 1, 1, d)``);
- biases of every kind (a name part ending in ``bias``: ``final_logits_bias``, ``e_score_correction_bias``,
  ``relative_position_bias_table``), which transformers' ``_init_weights`` sets to zero;
- ``ZERO_INIT``: the matrices transformers' ``_init_weights``, PEFT and diffusers initialise to zero,
  where a checkpoint saved before training (or an adapter never trained) holds them as they were;
- quantization metadata (scales, zero points, ``g_idx``: one value by design in a symmetric set),
  packed payloads stored under a float dtype (bitsandbytes' bf16 storage), and integer tensors other
  than a module's ``weight`` (a BitNet U8 ``weight`` is checked, GPTQ's ``qweight`` is not).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from guard import dtypes
from guard.catalogue import make_finding
from guard.findings import Finding, shown
from guard.inventory import ModelInventory
from guard.records import Record
from guard.tensors import TensorInfo

FIRST_READ = 4096  # a trained matrix shows two values in its first few KiB
CHUNK_BYTES = 1 << 20
# Conservative on purpose: a name part (between dots) that matches is never reported, in any model.
ZERO_INIT_PARTS = re.compile(
    r".*bias"  # every bias (transformers zero-initialises them)
    r"|lora_B|lora_embedding_B"  # PEFT LoRA: B starts at zero, so an untrained adapter is zero
    r"|mask_token|cls_token|register_tokens|distillation_token|query_tokens|pos_embed"  # vision tokens (ViT family)
    r"|rel_pos_h|rel_pos_w|mm_input_projection_weight|static_weight"  # SAM, Gemma 3, Inkling
    r"|no_memory_embedding|no_object_pointer|occlusion_spatial_embedding_parameter"  # SAM 2
    r"|memory_temporal_positional_encoding|no_memory_positional_encoding"
    r"|embed_avg|cluster_size|logit_scale"  # VQ codebooks' running averages
    r"|controlnet_down_blocks|controlnet_mid_block|conv_out"  # diffusers' ControlNet zero convolutions
    r"|.*scales?(_2|_inv)?|.*zeros|.*zero_points?|.*absmax|SCB|g_idx"  # quantization metadata: uniform by design
)
# model_type -> the name endings its class's _init_weights zeroes (transformers 5.x), trained or not.
ZERO_INIT_BY_MODEL: dict[str, tuple[str, ...]] = {
    "afmoe": ("router.gate.weight",),
    "neomme": ("o_proj.weight", "down_proj.weight", "value_embeddings.weight"),
    "esm": ("linear_z.weight", "linear_o.weight", "o_proj.weight", "pair_to_sequence.linear.weight",
            "g_proj.weight"),
    "esmfold2": ("plddt_weight", "resolved_weight", "adaln_linear.weight", "single_to_token.weight"),
    "pi05": ("dense.weight",),
    "xlstm": ("gate.weight",),
}
SIGNED_ZERO = {"F16": 0x7FFF, "BF16": 0x7FFF, "F32": 0x7FFF_FFFF, "F64": 0x7FFF_FFFF_FFFF_FFFF,
               "F8_E4M3": 0x7F, "F8_E5M2": 0x7F}  # -0.0 is zero too (FNUZ's 0x80 is NaN)
BITS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


class Dead(Record):
    info: TensorInfo
    state: str  # "all zero", or "constant (0.5)"


def dead_weight_findings(inv: ModelInventory) -> list[Finding]:
    """CG207 for ``inv``: its weight matrices that hold one value, grouped.  Needs numpy (the values extra)."""
    from guard.values.located import located_tensors
    from guard.values.quantized import packed_under_float

    packed = packed_under_float(inv)
    model_type = inv.config.get("model_type") if isinstance(inv.config, dict) else None
    endings = ZERO_INIT_BY_MODEL.get(model_type, ()) if isinstance(model_type, str) else ()
    candidates = [t for t in located_tensors(inv) if is_candidate(t, endings) and (t.file, t.name) not in packed]
    dead: list[Dead] = []
    seen: dict[tuple[str, int], str | None] = {}  # tied weights and views: each range read once
    for info in candidates:
        assert info.data_start is not None
        key = (info.file, info.data_start)
        if key not in seen:
            seen[key] = uniform_state(info)
        state = seen[key]
        if state is not None:
            dead.append(Dead(info, state))
    return grouped_findings(dead)


def is_candidate(info: TensorInfo, endings: tuple[str, ...] = ()) -> bool:
    if sum(1 for n in info.shape if n > 1) < 2:
        return False
    if info.dtype == "F8_E8M0":  # exponent scales, never weights
        return False
    if not (dtypes.is_float(info.dtype) or (info.dtype in ("U8", "I8") and info.name.endswith(".weight"))):
        return False
    if info.data_start is None or info.data_end is None or info.data_end - info.data_start != info.nbytes:
        return False
    if any(ZERO_INIT_PARTS.fullmatch(part) for part in info.name.split(".")):
        return False
    return not any(info.name == e or info.name.endswith("." + e) for e in endings)


def uniform_state(info: TensorInfo) -> str | None:
    """"all zero", "constant (v)" or None (two values differ, a NaN constant, or the bytes do not read)."""
    import numpy as np

    from guard.values.minifloats import itemsize

    assert info.data_start is not None and info.data_end is not None
    size = itemsize(info.dtype) if info.dtype in SIGNED_ZERO or dtypes.is_float(info.dtype) else 1
    if size not in BITS:
        return None
    view = np.dtype(BITS[size])
    mask = SIGNED_ZERO.get(info.dtype)
    try:
        fd = os.open(info.file, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError:
        return None
    try:
        first: int | None = None
        zero = True
        for chunk in _chunks(fd, info.data_start, info.data_end):
            bits = np.frombuffer(chunk, dtype=view)
            if first is None:
                first = int(bits[0])
                zero = (first & mask if mask is not None else first) == 0
            if zero and mask is not None:
                if np.bitwise_and(bits, view.type(mask)).any():
                    return None
            elif (bits != view.type(first)).any():
                return None
    finally:
        os.close(fd)
    if first is None:
        return None
    if zero:
        return "all zero"
    value = _value(info.dtype, first, view)
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None  # NaN and Inf are CG203's
    return f"constant ({value:.9g})"


def _chunks(fd: int, start: int, end: int) -> Iterator[bytes]:
    pos, want = start, FIRST_READ
    while pos < end:
        data = os.pread(fd, min(want, end - pos), pos)
        usable = len(data) - len(data) % 8  # whole elements of every width
        if usable <= 0:
            return  # a short read: the file changed, or is truncated (CG001 elsewhere)
        yield data[:usable]
        pos += usable
        want = CHUNK_BYTES


def _value(code: str, bits: int, view: Any) -> float | None:
    import numpy as np

    from guard.values.minifloats import to_float32

    stored = np.array([bits], dtype=view)
    if not dtypes.is_float(code):
        return float(stored.view(np.int8 if code == "I8" else np.uint8)[0])
    if code == "F64":
        return float(stored.view(np.float64)[0])
    try:
        return float(to_float32(code, stored)[0])
    except (KeyError, ValueError):
        return None  # a float format with no fp32 table (F4, F6 packed codes): not named


def grouped_findings(dead: list[Dead]) -> list[Finding]:
    """One finding per (state, module path around the layer index, layers): the layers' leaves in braces."""
    layered: dict[tuple[str, str, str, str], dict[str, list[int]]] = {}
    flat: dict[tuple[str, str], list[Dead]] = {}
    first: dict[tuple[str, ...], Dead] = {}
    for d in dead:
        parts = d.info.name.split(".")
        at = next((i for i, p in enumerate(parts) if p.isdigit() and 0 < i < len(parts) - 1), None)
        if at is None:
            flat.setdefault((d.state, ".".join(parts[:-2])), []).append(d)
            continue
        key = (d.state, ".".join(parts[:at]), parts[at + 1], d.info.dtype)
        leaf = ".".join(parts[at + 2:])
        layered.setdefault(key, {}).setdefault(leaf, []).append(int(parts[at]))
        first.setdefault(key, d)
    findings = []
    for key, leaves in layered.items():
        state, prefix, module, dtype = key
        by_layers: dict[tuple[int, ...], list[str]] = {}
        for leaf, indices in leaves.items():
            by_layers.setdefault(tuple(sorted(set(indices))), []).append(leaf)
        for layers, names in by_layers.items():
            span = _ranges(layers)
            inner = _braced(sorted(names))
            pattern = f"{prefix}.[{span}].{module}" + (f".{inner}" if inner else "")
            count = len(layers) * len(names)
            lead = first[key].info
            findings.append(make_finding(
                "CG207", lead.file,
                f"the {module} weights of {'layer' if len(layers) == 1 else 'layers'} {span} are {state}: "
                f"{shown(pattern, 200)} ({count} {dtypes.display_name(dtype)} matri{'x' if count == 1 else 'ces'})",
                tensor=lead.name))
    for (state, _parent), group in flat.items():
        names = sorted(d.info.name for d in group)
        listed = ", ".join(shown(n) for n in names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        findings.append(make_finding(
            "CG207", group[0].info.file,
            f"{len(names)} weight matri{'x is' if len(names) == 1 else 'ces are'} {state}: {listed}",
            tensor=names[0]))
    return findings


def _braced(names: list[str]) -> str:
    """["down_proj.weight", "up_proj.weight"] -> "{down_proj,up_proj}.weight"."""
    if len(names) == 1:
        return names[0]
    split = [n.split(".") for n in names]
    common = 0
    while all(len(p) > common + 1 and p[-1 - common] == split[0][-1 - common] for p in split):
        common += 1
    tail = ".".join(split[0][len(split[0]) - common:]) if common else ""
    heads = sorted(".".join(p[:len(p) - common]) for p in split)
    return f"{{{','.join(heads)}}}" + (f".{tail}" if tail else "")


def _ranges(numbers: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> "0–2, 5"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)
