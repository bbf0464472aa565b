"""Megatron-core's GPTModel (torch_dist) as the HF Llama it is: stacked layers unstacked, fused tensors split.

Megatron-core saves each transformer layer's weights stacked on a leading layer axis
(``decoder.layers.self_attention.linear_qkv.weight`` of shape ``(L, rows, hidden)``), fuses q, k and v into
``linear_qkv`` (per query group: that group's query heads, then its key head, then its value head) and the
SwiGLU gate and up projections into ``linear_fc1`` (``[gate; up]``), and keeps each layer norm beside the
linear it feeds (``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``; Transformer Engine's
names, which the local spec also saves under).  The table below follows Megatron-Bridge's Llama mapping
(``src/megatron/bridge/models/llama/llama_bridge.py``, ``LlamaBridge.mapping_registry``; the fused splits
are its ``QKVMapping`` and ``GatedMLPMapping`` in ``src/megatron/bridge/models/conversion/param_mapping.py``).
Splitting q/k/v needs the heads from config.json; a checkpoint without one, of another architecture, or
with a tensor the table does not know is refused (CG304) rather than guessed, and nothing is written.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from guard.catalogue import make_finding
from guard.convert.read.source import SourceModel
from guard.tensors import TensorInfo
from guard.write.plan import SourceTensor

if TYPE_CHECKING:
    import numpy as np

# Megatron-core GPTModel key (N: the layer) -> the HF Llama key(s) it holds, in the order the fused rows are
LLAMA_FROM_MEGATRON: dict[str, tuple[str, ...]] = {
    "embedding.word_embeddings.weight": ("model.embed_tokens.weight",),
    "output_layer.weight": ("lm_head.weight",),
    "decoder.final_layernorm.weight": ("model.norm.weight",),
    "decoder.layers.N.self_attention.linear_proj.weight": ("model.layers.N.self_attn.o_proj.weight",),
    "decoder.layers.N.mlp.linear_fc2.weight": ("model.layers.N.mlp.down_proj.weight",),
    "decoder.layers.N.self_attention.linear_qkv.layer_norm_weight": ("model.layers.N.input_layernorm.weight",),
    "decoder.layers.N.mlp.linear_fc1.layer_norm_weight": ("model.layers.N.post_attention_layernorm.weight",),
    "decoder.layers.N.input_layernorm.weight": ("model.layers.N.input_layernorm.weight",),  # MEGATRON_USE_TE=false
    "decoder.layers.N.pre_mlp_layernorm.weight": ("model.layers.N.post_attention_layernorm.weight",),
    "decoder.layers.N.self_attention.linear_qkv.weight": ("model.layers.N.self_attn.q_proj.weight",
                                                          "model.layers.N.self_attn.k_proj.weight",
                                                          "model.layers.N.self_attn.v_proj.weight"),
    "decoder.layers.N.mlp.linear_fc1.weight": ("model.layers.N.mlp.gate_proj.weight",
                                               "model.layers.N.mlp.up_proj.weight"),
}
# how a fused tensor's rows split: "qkv" per query group (QKVMapping), "halves" [gate; up] (GatedMLPMapping)
FUSED: dict[str, str] = {"decoder.layers.N.self_attention.linear_qkv.weight": "qkv",
                         "decoder.layers.N.mlp.linear_fc1.weight": "halves"}
VOCAB_PADDED = frozenset({"embedding.word_embeddings.weight", "output_layer.weight"})  # rows past vocab_size: padding
LLAMA_TYPES = frozenset({"llama", "mistral"})  # the HF model types whose names and layout the table gives
_STACK = "decoder.layers."
_LAYER = re.compile(r"(?<=^decoder\.layers\.)\d+(?=\.)")


def is_megatron_gpt(names: set[str]) -> bool:
    """Megatron-core's own names (an HF model with `decoder.layers.` keys, BART's, has `self_attn`, `fc1`)."""
    return "embedding.word_embeddings.weight" in names or any(
        n.startswith(_STACK) and (".self_attention.linear_" in n or ".mlp.linear_fc" in n) for n in names)


def from_megatron(source: SourceModel, config: dict[str, Any] | None) -> SourceModel:
    """The source with HF Llama names, one tensor per layer and per q/k/v, gate/up; unchanged when it is not
    Megatron-core's GPTModel."""
    if source.findings or not is_megatron_gpt({t.name for t in source.tensors}):
        return source
    where = str(source.files[0].parent if source.files else ".")
    shape = _shape(config)
    if isinstance(shape, str):
        source.findings.append(make_finding("CG304", where,
                                            f"a Megatron-core GPT checkpoint: {shape}; nothing written"))
        return source
    out = SourceModel(source.framework, "megatron-torch_dist", source.files, None)
    loader = MegatronLoader(shape)
    for tensor in source.tensors:
        out.findings += loader.add(tensor, out, where)
    if out.findings:
        out.tensors.clear()
    return out


def _shape(config: dict[str, Any] | None) -> dict[str, int] | str:
    """The numbers the splits need, from config.json, or why they cannot be had."""
    if not isinstance(config, dict):
        return "splitting its fused q/k/v needs the model's config.json (give it with --config)"
    if config.get("model_type") not in LLAMA_TYPES:
        return (f"model_type {config.get('model_type')!r}: only Llama's layout (Megatron-Bridge's LlamaBridge) is "
                "mapped, and convert refuses rather than guess another")
    try:
        heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
        groups = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        return {"heads": heads, "groups": groups, "head_dim": head_dim, "vocab": int(config["vocab_size"]),
                "ffn": int(config["intermediate_size"]), "layers": int(config["num_hidden_layers"])}
    except (KeyError, TypeError, ValueError) as exc:
        return f"config.json lacks a number the split needs ({exc})"


class MegatronLoader:
    """Loads one HF tensor: its layer's slab of the stacked tensor, the rows of its part, vocab padding cut."""

    def __init__(self, shape: dict[str, int]) -> None:
        self.shape = shape
        self.plan: dict[str, tuple[SourceTensor, int | None, str, int]] = {}  # name -> (stored, layer, split, part)

    def add(self, tensor: SourceTensor, out: SourceModel, where: str) -> list[Any]:
        """Plans the HF tensors one stored tensor holds; a finding where it cannot be placed."""
        name, shape = tensor.name, tensor.info.shape
        layer = _LAYER.search(name)
        layers: list[int | None]  # a name with no layer: [None] stands for its one layer
        if layer is not None:
            pattern, layers = _LAYER.sub("N", name, count=1), [int(layer.group(0))]
            rows = shape
        elif name.startswith(_STACK):
            pattern, layers, rows = "decoder.layers.N." + name[len(_STACK):], list(range(shape[0] if shape else 0)), \
                shape[1:]
        else:
            pattern, layers, rows = name, [None], shape
        targets = LLAMA_FROM_MEGATRON.get(pattern)
        if targets is None:
            return [make_finding("CG304", where, f"Megatron tensor {name!r} has no place in HF Llama (Megatron-"
                                 "Bridge's LlamaBridge maps no such name): convert refuses rather than guess",
                                 tensor=name)]
        if layer is None and name.startswith(_STACK) and len(layers) != self.shape["layers"]:
            return [make_finding("CG304", where, f"{name} {list(shape)} stacks {len(layers)} layers; config.json "
                                 f"says num_hidden_layers {self.shape['layers']}", tensor=name)]
        parts = self._part_rows(pattern, rows)
        if isinstance(parts, str):
            return [make_finding("CG304", where, f"{name} {list(shape)}: {parts}", tensor=name)]
        for index in layers:
            for part, (target, part_rows) in enumerate(zip(targets, parts)):
                hf = target.replace("N", str(index), 1) if index is not None else target
                self.plan[hf] = (tensor, index, FUSED.get(pattern, "whole"), part)
                info = TensorInfo(hf, tensor.info.dtype, (part_rows, *rows[1:]) if rows else rows, tensor.info.file)
                out.tensors.append(SourceTensor(info, self))
        return []

    def _part_rows(self, pattern: str, rows: tuple[int, ...]) -> list[int] | str:
        s = self.shape
        split = FUSED.get(pattern)
        if split == "qkv":
            want = (s["heads"] + 2 * s["groups"]) * s["head_dim"]
            if len(rows) != 2 or rows[0] != want or s["heads"] % s["groups"]:
                return (f"does not split into {s['heads']} query heads in {s['groups']} groups of head_dim "
                        f"{s['head_dim']} ({want} rows)")
            return [s["heads"] * s["head_dim"], s["groups"] * s["head_dim"], s["groups"] * s["head_dim"]]
        if split == "halves":
            if len(rows) != 2 or rows[0] != 2 * s["ffn"]:
                return f"is not [gate; up] of intermediate_size {s['ffn']}"
            return [s["ffn"], s["ffn"]]
        if pattern in VOCAB_PADDED:
            if len(rows) != 2 or rows[0] < s["vocab"]:
                return f"holds fewer rows than vocab_size {s['vocab']}"
            return [s["vocab"]]
        return [rows[0]] if rows else [1]

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        tensor, layer, split, part = self.plan[info.name]
        if layer is None or _LAYER.search(tensor.name):
            array = tensor.load()
        elif hasattr(tensor.loader, "load_slab"):  # one layer's chunks, not the whole stack
            array = tensor.loader.load_slab(tensor.info, layer)
        else:
            array = tensor.load()[layer]
        if split == "qkv":
            s = self.shape
            per = s["heads"] // s["groups"]
            grouped = array.reshape(s["groups"], per + 2, s["head_dim"], -1)  # per group: its q heads, k, v
            picked = (grouped[:, :per], grouped[:, per], grouped[:, per + 1])[part]
            array = picked.reshape(-1, array.shape[-1])
        elif split == "halves":
            array = array[:info.shape[0]] if part == 0 else array[info.shape[0]:]
        elif info.shape and array.shape and array.shape[0] != info.shape[0]:
            array = array[:info.shape[0]]  # Megatron's vocab padding: the rows past vocab_size
        return np.ascontiguousarray(array)
