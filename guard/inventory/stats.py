"""Small records the inventory, its sets and the report share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from guard.records import record
from guard.tensors import TensorInfo


@record
class DtypeStats:
    tensors: int = 0
    parameters: int = 0
    bytes: int = 0

    def to_json(self) -> dict[str, int]:
        return {"tensors": self.tensors, "parameters": self.parameters, "bytes": self.bytes}


@record
class ConfigDtype:
    key: str  # "torch_dtype", "text_config.dtype", ...
    value: str
    line: int | None


@record
class ShardIndex:
    path: str
    weight_map: Mapping[str, str]  # tensor -> shard file name; empty when the index is unusable
    text: str = ""


def dtype_summary(tensors: Iterable[TensorInfo]) -> dict[str, DtypeStats]:
    """Per dtype code: tensors, parameters, bytes; the dtype holding most parameters first."""
    stats: dict[str, list[int]] = {}
    for tensor in tensors:
        row = stats.setdefault(tensor.dtype, [0, 0, 0])
        row[0] += 1
        row[1] += tensor.numel
        row[2] += tensor.nbytes or 0
    order = sorted(stats, key=lambda code: -stats[code][1])
    return {code: DtypeStats(*stats[code]) for code in order}
