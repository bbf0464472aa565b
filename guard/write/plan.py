"""What the writing layer is handed: source tensors, each placed under a target key with an axis order.

Convert builds these from its name mapping; fix builds them from a scanned weight set
(the identity mapping: same names, same axes, maybe another dtype).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from guard.records import Record
from guard.tensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np

Key = tuple[str, ...]
Perm = tuple[int, ...]


def permuted(shape: tuple[int, ...], perm: Perm | None) -> tuple[int, ...]:
    return shape if perm is None else tuple(shape[i] for i in perm)


class Loader(Protocol):
    def load(self, info: TensorInfo) -> np.ndarray: ...


class SourceTensor(Record):
    info: TensorInfo
    loader: Loader

    @property
    def name(self) -> str:
        return self.info.name

    def load(self) -> np.ndarray:
        return self.loader.load(self.info)


class Mapped(Record):
    source: SourceTensor
    target: Key
    perm: Perm | None  # axes of the source array, in target order

    @property
    def shape(self) -> tuple[int, ...]:
        return permuted(self.source.info.shape, self.perm)
