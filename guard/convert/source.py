"""Find a model directory's weights (safetensors, .bin, Flax msgpack; single or sharded) and list them.

Only headers are read here (a ``.bin`` shard is memory-mapped); tensor data is read
later, one tensor at a time, by the loader attached to each tensor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from guard.catalogue import make_finding
from guard.convert.io_flax import FlaxWholeFileLoader
from guard.convert.io_torch import RangeLoader, TorchBinLoader, UnsafePickle, torch_bin_tensors
from guard.errors import MalformedCheckpoint, UsageError
from guard.findings import Finding
from guard.readers import scan_file
from guard.sources import LocalFile
from guard.tensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np

# (framework, format, single-file name); the index is "<name>.index.json", shards "<stem>-0000k-of-0000N<ext>".
LAYOUTS = (
    ("torch", "safetensors", "model.safetensors"),
    ("torch", "torch-bin", "pytorch_model.bin"),
    ("flax", "flax-msgpack", "flax_model.msgpack"),
)
WEIGHT_NAMES = {name for _, _, name in LAYOUTS} | {name + ".index.json" for _, _, name in LAYOUTS}


class Loader(Protocol):
    def load(self, info: TensorInfo) -> np.ndarray: ...


@dataclass(frozen=True)
class SourceTensor:
    info: TensorInfo
    loader: Loader

    @property
    def name(self) -> str:
        return self.info.name

    def load(self) -> np.ndarray:
        return self.loader.load(self.info)


@dataclass
class SourceModel:
    framework: str  # "torch" | "flax"
    format: str
    files: list[Path]
    index: Path | None
    tensors: list[SourceTensor] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def separator(self) -> str:
        return "/" if self.framework == "flax" else "."


def choose_layout(src: Path, *, to: str) -> tuple[str, str, str]:
    """The weights to read: the other framework's first, as converting is what was asked."""
    present = [lay for lay in LAYOUTS if (src / lay[2]).is_file() or (src / (lay[2] + ".index.json")).is_file()]
    if not present:
        raise UsageError(f"{src}: no model.safetensors, pytorch_model.bin or flax_model.msgpack (or index) found")
    other = [lay for lay in present if lay[0] != to]
    return (other or present)[0]


def open_source(src: Path, *, to: str) -> SourceModel:
    framework, fmt, name = choose_layout(src, to=to)
    index_path = src / (name + ".index.json")
    model = SourceModel(framework, fmt, [], index_path if index_path.is_file() else None)
    weight_map: dict[str, str] | None = None
    if model.index is not None:
        weight_map = _read_index(model.index, model.findings)
        if weight_map is None:
            return model
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            path = src / shard
            if Path(shard).name != shard or not path.is_file():
                lost = sum(1 for f in weight_map.values() if f == shard)
                model.findings.append(make_finding(
                    "CG004", str(model.index), f"shard {shard} is missing ({lost} tensor(s) listed in it)"))
            else:
                model.files.append(path)
    else:
        model.files.append(src / name)
    loader: Loader = TorchBinLoader() if fmt == "torch-bin" else RangeLoader()
    chunked = FlaxWholeFileLoader()
    for path in model.files:
        for info in _list_tensors(path, fmt, model.findings):
            use = chunked if fmt == "flax-msgpack" and info.data_start is None else loader
            model.tensors.append(SourceTensor(info, use))
    if weight_map is not None and not model.findings:
        _check_index(model, weight_map)
    return model


def _read_index(path: Path, findings: list[Finding]) -> dict[str, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError("weight_map is not an object of file names")
        return {str(k): v for k, v in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        findings.append(make_finding("CG004", str(path), f"unreadable shard index: {exc}"))
        return None


def _list_tensors(path: Path, fmt: str, findings: list[Finding]) -> list[TensorInfo]:
    if fmt == "torch-bin":
        try:
            return torch_bin_tensors(path)
        except UnsafePickle as exc:
            findings.append(make_finding("CG003", str(path), f"unsafe pickle: {exc}"))
        except MalformedCheckpoint as exc:
            findings.append(make_finding("CG001", str(path), f"unreadable checkpoint: {exc}"))
        return []
    with LocalFile(path) as source:
        scan = scan_file(source)
    findings.extend(scan.findings)
    if scan.format is None:
        return []
    if scan.metadata.get("format") == "flax":
        raise UsageError(f"{path}: Flax safetensors are not supported; use flax_model.msgpack")
    return list(scan.tensors)


def _check_index(model: SourceModel, weight_map: dict[str, str]) -> None:
    assert model.index is not None
    found = {t.name: Path(t.info.file).name for t in model.tensors}
    for name, shard in sorted(weight_map.items()):
        if found.get(name) != shard:
            where = f"in {found[name]}" if name in found else "in no shard"
            model.findings.append(make_finding(
                "CG004", str(model.index), f"{name} is listed in {shard} but found {where}", tensor=name))
    for name in sorted(set(found) - set(weight_map)):
        model.findings.append(make_finding(
            "CG004", str(model.index), f"{name} is in {found[name]} but not in the index", tensor=name))
