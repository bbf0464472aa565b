"""torchtitan's Llama checkpoint as the HF model it is: its own names mapped, its q/k RoPE layout undone.

torchtitan keeps the model's keys at the top level of its DCP state dict in its own names
(``tok_embeddings``, ``layers.N.attention.wq``, ``feed_forward.w1``, ...), and its attention computes RoPE
on interleaved pairs, so ``wq`` and ``wk`` hold each head's rows in the order Meta's original checkpoints
use.  HF Llama rotates halves: each head's rows are permuted on the way (torchtitan's
``state_dict_adapter.to_hf``; reading them unpermuted gives garbage, torchtitan#1291).  The permutation
needs the heads (``num_attention_heads``, ``num_key_value_heads``) from config.json; without one, or for a
name the table does not know, the conversion is refused (CG304) rather than guessed.
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

# torchtitan name (N: the layer) -> HF Llama name
TORCHTITAN_LLAMA: dict[str, str] = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "layers.N.attention.wq.weight": "model.layers.N.self_attn.q_proj.weight",
    "layers.N.attention.wk.weight": "model.layers.N.self_attn.k_proj.weight",
    "layers.N.attention.wv.weight": "model.layers.N.self_attn.v_proj.weight",
    "layers.N.attention.wo.weight": "model.layers.N.self_attn.o_proj.weight",
    "layers.N.feed_forward.w1.weight": "model.layers.N.mlp.gate_proj.weight",
    "layers.N.feed_forward.w2.weight": "model.layers.N.mlp.down_proj.weight",
    "layers.N.feed_forward.w3.weight": "model.layers.N.mlp.up_proj.weight",
    "layers.N.attention_norm.weight": "model.layers.N.input_layernorm.weight",
    "layers.N.ffn_norm.weight": "model.layers.N.post_attention_layernorm.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# which config key counts the heads whose rows are permuted
PERMUTED: dict[str, str] = {"layers.N.attention.wq.weight": "num_attention_heads",
                            "layers.N.attention.wk.weight": "num_key_value_heads"}
_LAYER = re.compile(r"(?<=^layers\.)\d+(?=\.)")


def is_torchtitan_llama(names: set[str]) -> bool:
    return "tok_embeddings.weight" in names and any(".attention.wq." in n for n in names)


def from_torchtitan(source: SourceModel, config: dict[str, Any] | None) -> SourceModel:
    """The source with HF Llama names and q/k rows in HF's order; unchanged when it is not torchtitan's Llama."""
    if source.findings or not is_torchtitan_llama({t.name for t in source.tensors}):
        return source
    where = source.files[0].parent if source.files else "."
    heads = _heads(config)
    if heads is None:
        source.findings.append(make_finding(
            "CG304", str(where), "a torchtitan Llama checkpoint: undoing its q/k RoPE permutation needs the model's "
            "config.json (num_attention_heads, num_key_value_heads): give it with --config; nothing written"))
        return source
    out = SourceModel(source.framework, "dcp-torchtitan", source.files, None)
    permuting = PermutingLoader()
    for tensor in source.tensors:
        pattern = _LAYER.sub("N", tensor.name, count=1)
        target = TORCHTITAN_LLAMA.get(pattern)
        if target is None:
            out.findings.append(make_finding("CG304", str(where), f"torchtitan tensor {tensor.name!r} has no place in "
                                             "HF Llama: convert refuses rather than guess", tensor=tensor.name))
            continue
        layer = _LAYER.search(tensor.name)
        name = target.replace("N", layer.group(0), 1) if layer else target
        info = tensor.info._replace(name=name)
        count = heads.get(PERMUTED.get(pattern, ""), 0)
        if count and (len(info.shape) != 2 or info.shape[0] % (2 * count)):
            out.findings.append(make_finding("CG304", str(where), f"{tensor.name} {list(info.shape)} does not split "
                                             f"into {count} heads of pairs", tensor=tensor.name))
            continue
        permuting.plan[name] = (tensor, count)
        out.tensors.append(SourceTensor(info, permuting))
    return out


def _heads(config: dict[str, Any] | None) -> dict[str, int] | None:
    if not isinstance(config, dict) or not isinstance(config.get("num_attention_heads"), int):
        return None
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads")
    return {"num_attention_heads": heads, "num_key_value_heads": kv if isinstance(kv, int) else heads}


class PermutingLoader:
    """Loads the torchtitan tensor and, for wq/wk, orders each head's rows as HF's rotary halves expect."""

    def __init__(self) -> None:
        self.plan: dict[str, tuple[SourceTensor, int]] = {}  # HF name -> (the stored tensor, heads to permute)

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        tensor, heads = self.plan[info.name]
        array = tensor.load()
        if not heads:
            return array
        rows, cols = array.shape
        # (heads, pairs, 2, cols) -> (heads, 2, pairs, cols): the first of each pair, then the second
        return np.ascontiguousarray(array.reshape(heads, rows // heads // 2, 2, cols).transpose(0, 2, 1, 3)
                                    ).reshape(rows, cols)
