"""Small records the inventory, its sets and the report share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from math import prod

from guard import dtypes
from guard.records import Record
from guard.tensors import TensorInfo


class DtypeStats(Record):
    tensors: int = 0
    parameters: int = 0
    bytes: int = 0

    def to_json(self) -> dict[str, int]:
        return {"tensors": self.tensors, "parameters": self.parameters, "bytes": self.bytes}


class ConfigDtype(Record):
    key: str  # "torch_dtype", "text_config.dtype", ...
    value: str
    line: int | None


class ShardIndex(Record):
    path: str
    weight_map: Mapping[str, str]  # tensor -> shard file name; empty when the index is unusable
    text: str = ""  # the JSON, for the line of a finding; "" where the index is proven
    proven: bool = False  # equal, byte for byte, to the index its set's shard headers make (index_proof)


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


def grouped_dtype_summary(groups: Mapping[str, Sequence[TensorInfo]],
                          parameters: Mapping[str, int]) -> dict[str, DtypeStats]:
    """``dtype_summary`` of tensors already grouped by dtype, with their element sums (a weight set's)."""
    stats: dict[str, DtypeStats] = {}
    for code in sorted(groups, key=lambda c: -parameters[c]):  # stable: first appearance breaks ties
        group, elements = groups[code], parameters[code]
        info = dtypes.ALL_DTYPES.get(code)
        if info is not None and info.block is None and info.bits and info.bits % 8 == 0:
            size = elements * info.bits // 8  # whole bytes per element: the sum needs no per-tensor rounding
        else:  # sub-byte codes round up per tensor, block types per block; unknown codes have no size
            size = sum(dtypes.nbytes(code, prod(t.shape)) or 0 for t in group)
        stats[code] = DtypeStats(len(group), elements, size)
    return stats
