"""The way back: a MaxText checkpoint written by ``convert --to maxtext`` -> HF safetensors and config.json.

Each HF tensor is its slice of a MaxText leaf put through the row's steps in reverse; the
leaves are read one at a time (a one-leaf cache, the outputs ordered leaf by leaf), and
written by the same streaming writer, verification and rename as every other convert.
The result equals the source bit for bit except for the declared roundings (CG301 when
it was written).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from guard.convert import steps
from guard.convert.maxtext.ocdbt import ItemsReader, read_custom
from guard.convert.maxtext.plan import Leaf, dimensions, plan_leaves
from guard.errors import GuardError, MalformedCheckpoint, UsageError
from guard.findings import Finding, Severity
from guard.targets.maxtext import ARCHITECTURES
from guard.tensors import TensorInfo


class LeafSlices:
    """Loads an HF tensor from its leaf; keeps the last leaf read, so that leaf-ordered loads read each once."""

    def __init__(self, reader: ItemsReader, places: dict[str, tuple[Leaf, tuple[int, ...]]], head_dim: int) -> None:
        self._reader, self._places, self._head_dim = reader, places, head_dim
        self._key: tuple[str, ...] | None = None
        self._array: Any = None

    def load(self, info: TensorInfo) -> Any:
        import numpy as np

        leaf, at = self._places[info.name]
        if self._key != leaf.key:
            self._array = None
            self._array = self._reader.read(leaf.key)
            self._key = leaf.key
            if tuple(self._array.shape) != leaf.shape:
                raise MalformedCheckpoint(f"{leaf.name} has shape {list(self._array.shape)}, not {list(leaf.shape)}")
        piece = self._array[leaf.place(at)] if leaf.axes else self._array
        return np.ascontiguousarray(steps.to_hf(piece, leaf.param.steps, self._head_dim))


def convert_from_maxtext(items: Path, out: Path, *, max_shard_size: int) -> tuple[list[Finding], dict[str, Any]]:
    from guard.convert.carry import main_dtype, with_dtype
    from guard.write.plan import Mapped, SourceTensor
    from guard.write.publish import discard, make_temp_dir, publish
    from guard.write.verify import verify_output
    from guard.write.writer import OutputTensor, plan_shards, write_output

    started = time.monotonic()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out}: already exists and is not empty; choose a new --out directory")
    try:
        custom = read_custom(items)
    except MalformedCheckpoint as exc:
        raise GuardError(f"{items}: {exc}; nothing written") from None
    if custom is None or custom.get("row") not in ARCHITECTURES or not isinstance(custom.get("config"), dict):
        raise UsageError(f"{items}: a MaxText checkpoint that ckpt-guard did not write; its HF config.json and "
                         "mapping are unknown, so it cannot be converted back")
    row, config, scan = ARCHITECTURES[custom["row"]], custom["config"], bool(custom.get("scan_layers"))
    listed = listed_tensors(custom.get("hf_tensors"), items)
    leaves, findings = plan_leaves(row, config, listed, scan=scan, path=str(items))
    if findings:
        return findings, {"written": False, "output": str(out)}
    places = {name: (leaf, at) for leaf in leaves for at, name in leaf.grid}
    loader = LeafSlices(ItemsReader(items), places, dimensions(config)["H"])
    outputs = [OutputTensor(Mapped(SourceTensor(listed[name], loader), (name,), None), name, listed[name].dtype)
               for leaf in leaves for _, name in leaf.grid]
    shards = plan_shards(outputs, max_shard_size)
    temp = make_temp_dir(out)
    try:
        written = write_output(temp, shards, layout="safetensors")
        verify_findings, verified = verify_output(temp, outputs, written, layout="safetensors", full=False)
        findings += verify_findings
        if any(f.severity is Severity.error for f in findings):
            discard(temp)
            return findings, {"written": False, "output": str(out)}
        counts: dict[str, int] = {}
        for t in outputs:
            counts[t.dtype] = counts.get(t.dtype, 0) + (t.mapped.source.info.numel or 0)
        dtype_name = main_dtype(counts)
        restored = with_dtype(config, dtype_name) if dtype_name else config
        (temp / "config.json").write_text(json.dumps(restored, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        publish(temp, out)
    except MalformedCheckpoint as exc:
        discard(temp)
        raise GuardError(f"{items}: {str(exc).splitlines()[0][:300]}; nothing written") from None
    except BaseException:
        discard(temp)
        raise
    return findings, {"written": True, "source": str(items), "output": str(out), "from": "maxtext", "to": "torch",
                      "architecture": row.name, "tensors_out": len(outputs), "shards_out": len(shards),
                      "verified": verified, "declared_roundings": custom.get("declared_roundings", {}),
                      "seconds": round(time.monotonic() - started, 3)}


def listed_tensors(record: Any, items: Path) -> dict[str, TensorInfo]:
    """The HF tensors the record names (dtype code, shape); a record that is not that is one line, no output."""
    from guard import dtypes

    def valid(entry: Any) -> bool:
        return (isinstance(entry, list) and len(entry) == 2 and entry[0] in dtypes.DTYPES
                and isinstance(entry[1], list) and all(isinstance(d, int) and d >= 0 for d in entry[1]))

    if not isinstance(record, dict) or not record or not all(isinstance(k, str) and valid(v)
                                                             for k, v in record.items()):
        raise GuardError(f"{items}: _METADATA's ckpt_guard record lists no valid HF tensors; nothing written")
    return {name: TensorInfo(name, code, tuple(shape), str(items)) for name, (code, shape) in record.items()}
