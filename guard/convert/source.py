"""Find a model directory's weights (safetensors, .bin, Flax msgpack; single or sharded) and list them.

Only headers are read here (a ``.bin`` shard is memory-mapped); tensor data is read
later, one tensor at a time, by the loader attached to each tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from guard.catalogue import make_finding
from guard.config import Policy
from guard.convert.io_flax import FlaxWholeFileLoader
from guard.convert.io_torch import RangeLoader, TorchBinLoader, UnsafePickle, torch_bin_tensors
from guard.errors import MalformedCheckpoint, UsageError
from guard.findings import Finding
from guard.inventory import build_inventory, read_small_file, scan_local_file
from guard.rules.shards import check_shard_index
from guard.tensors import FileScan, TensorInfo

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
    scans: dict[Path, FileScan] = {}
    if model.index is None:
        model.files.append(src / name)
        scans[src / name] = scan_local_file(src / name)  # our headers first: torch never sees a CG003 file
    elif not _check_shards(src, model, scans):
        return model
    loader: Loader = TorchBinLoader() if fmt == "torch-bin" else RangeLoader()
    chunked = FlaxWholeFileLoader()
    for path in model.files:
        for info in _list_tensors(path, fmt, model.findings, scans.get(path)):
            use = chunked if fmt == "flax-msgpack" and info.data_start is None else loader
            model.tensors.append(SourceTensor(info, use))
    return model


def _check_shards(src: Path, model: SourceModel, scans: dict[Path, FileScan]) -> bool:
    """The scanner's own index checks (CG001/CG004) on the shards' headers; False if unusable."""
    assert model.index is not None
    json_files = {str(model.index): read_small_file(model.index)}
    parsed = build_inventory(str(src), [], json_files=json_files)
    if not parsed.indexes or not parsed.indexes[0].weight_map:
        model.findings.extend(parsed.findings)  # not JSON (CG001) or no weight_map (CG004)
        return False
    for shard in sorted(set(parsed.indexes[0].weight_map.values())):
        path = src / shard
        if Path(shard).name == shard and path.is_file():  # never follow "../" out of the model
            model.files.append(path)
            scans[path] = scan_local_file(path)
    inventory = build_inventory(str(src), scans.values(), json_files=json_files)
    model.findings.extend(check_shard_index(inventory, Policy()))
    return True


def _list_tensors(path: Path, fmt: str, findings: list[Finding], scan: FileScan | None) -> list[TensorInfo]:
    if fmt == "torch-bin" and scan is not None and any(f.code in ("CG001", "CG003") for f in scan.findings):
        findings.extend(scan.findings)  # unreadable or unsafe headers: torch never opens the file
        return []
    if fmt == "torch-bin":
        try:
            return torch_bin_tensors(path)
        except UnsafePickle as exc:
            findings.append(make_finding("CG003", str(path), f"unsafe pickle: {exc}"))
        except MalformedCheckpoint as exc:
            findings.append(make_finding("CG001", str(path), f"unreadable checkpoint: {exc}"))
        return []
    assert scan is not None  # open_source scans every file's headers first
    findings.extend(scan.findings)
    if scan.format is None:
        return []
    if scan.metadata.get("format") == "flax":
        raise UsageError(f"{path}: Flax safetensors are not supported; use flax_model.msgpack")
    return list(scan.tensors)
