"""Tensors the way back to PyTorch must write although the Flax tree has no place for them.

PyTorch's BatchNorm keeps a ``num_batches_tracked`` counter beside ``running_mean``; Flax
keeps none, so the count is lost on the way to Flax.  Written back as 0 (a fresh layer's
value), PyTorch's ``from_pretrained`` finds nothing missing; the report says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from guard.convert.naming import Mapped, Mapping
from guard.convert.source import SourceTensor
from guard.tensors import TensorInfo

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
