"""Tensors the way back to PyTorch must write although the Flax tree has no place for them.

- PyTorch's BatchNorm keeps a ``num_batches_tracked`` counter beside ``running_mean``; Flax
  keeps none, so the count is lost on the way to Flax.  Written back as 0 (a fresh layer's
  value), PyTorch's ``from_pretrained`` finds nothing missing.
- Marian, Pegasus and RoFormer store a frozen sinusoidal position table that Flax computes.
  It is rebuilt with transformers' formula (float64 sin/cos, first half sin, second half cos,
  rounded to float32), which reproduces the saved table bit for bit, but only where the target
  class's ``save_pretrained`` holds it: MarianMTModel leaves its tables out
  (``_keys_to_ignore_on_save``) and computes them on load, so the way back writes none.
The report lists both.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from guard.convert.map.families import FAMILIES
from guard.convert.map.mapped import Mapping
from guard.tensors import TensorInfo
from guard.write.plan import Mapped, SourceTensor

if TYPE_CHECKING:
    import numpy as np


class ZeroCounter:
    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        return np.zeros((), dtype=np.int64)


def restore_counters(mapping: Mapping) -> None:
    """One int64 ``num_batches_tracked`` = 0 beside every BatchNorm ``running_mean`` written."""
    loader = ZeroCounter()
    for m in list(mapping.tensors):
        if m.target[-1] == "running_mean":
            name = ".".join((*m.target[:-1], "num_batches_tracked"))
            info = TensorInfo(name, "I64", (), m.source.info.file)
            restored = SourceTensor(info, loader)
            mapping.tensors.append(Mapped(restored, tuple(name.split(".")), None))
            mapping.decide("restored", restored)


# model_type -> (stacks holding a table, the stacks' layer list, (positions, width) from the config)
SINUSOIDAL: dict[str, tuple[tuple[str, ...], str, Any]] = {
    "marian": (("encoder", "decoder"), "layers", lambda c: (c["max_position_embeddings"], c["d_model"])),
    "pegasus": (("encoder", "decoder"), "layers", lambda c: (c["max_position_embeddings"], c["d_model"])),
    "roformer": (("encoder",), "layer",
                 lambda c: (c["max_position_embeddings"], c["hidden_size"] // c["num_attention_heads"])),
}


class SinusoidalTable:
    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        from guard.write.bitviews import numpy_dtype

        n_pos, dim = info.shape
        j = np.arange(dim)
        angles = np.arange(n_pos, dtype=np.float64)[:, None] / np.power(10000, 2 * (j // 2) / dim)[None, :]
        half = dim // 2 + dim % 2
        out = np.empty((n_pos, dim), dtype=np.float32)
        out[:, :half] = np.sin(angles[:, 0::2]).astype(np.float32)
        out[:, half:] = np.cos(angles[:, 1::2]).astype(np.float32)
        return out.astype(numpy_dtype(info.dtype))


def restore_tables(mapping: Mapping, config: dict[str, Any], *, dtype: str) -> None:
    """The frozen sinusoidal tables of Marian, Pegasus and RoFormer, beside the stacks that use them."""
    model_type = str(config.get("model_type"))
    plan = SINUSOIDAL.get(model_type)
    if plan is None:
        return
    family = FAMILIES.get(model_type)
    unsaved = family.unsaved.get(mapping.architecture or "", ()) if family else ()
    stacks, layers, size = plan
    try:
        shape = tuple(int(n) for n in size(config))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return  # the shape checks name what is wrong with such a config
    bases = {m.target[:i + 1] for m in mapping.tensors for i in range(len(m.target) - 1)
             if m.target[i] in stacks and m.target[i + 1] == layers}
    loader = SinusoidalTable()
    for base in sorted(bases):
        name = ".".join((*base, "embed_positions", "weight"))
        held = any(".".join(m.target) == name for m in mapping.tensors)
        if held or any(re.search(p + "$", name) for p in unsaved):
            continue
        restored = SourceTensor(TensorInfo(name, dtype, shape, mapping.tensors[0].source.info.file), loader)
        mapping.tensors.append(Mapped(restored, tuple(name.split(".")), None))
        mapping.decide("restored_table", restored)
