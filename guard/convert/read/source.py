"""Find a model directory's weights (safetensors, .bin, Flax msgpack; single or sharded) and list them.

Only headers are read here (a ``.bin`` shard is memory-mapped); tensor data is read
later, one tensor at a time, by the loader attached to each tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from guard import jsonload
from guard.catalogue import make_finding
from guard.config import Policy
from guard.convert.read.io_flax import FlaxChunkedLoader
from guard.convert.read.io_torch import RangeLoader, TorchBinLoader, UnsafePickle, torch_bin_tensors
from guard.errors import MalformedCheckpoint, UsageError
from guard.findings import Finding
from guard.inventory import build_inventory, read_small_file, scan_local_file
from guard.rules.shards import check_shard_index
from guard.tensors import FileScan, TensorInfo
from guard.write.plan import Loader, SourceTensor


@dataclass  # mutable: readers append tensors and findings as they open the files
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


# A weight set's format family (guard.inventory) -> (framework, the format name convert uses)
_FAMILIES = {"safetensors": ("torch", "safetensors"), "torch": ("torch", "torch-bin"), "flax": ("flax", "flax-msgpack")}
_STEMS = ("model", "pytorch_model", "flax_model")


def choose_layout(src: Path, *, to: str, variant: str | None = None) -> tuple[str, str, Path | None, Path | None]:
    """(framework, format, single file, index) of the weight set to read.

    The sets are the scanner's own (``guard.inventory.names``): the primary set's variant
    unless ``variant`` names another; the other framework's copy first, as converting is what
    was asked; safetensors before ``.bin``.  A choice the names leave open is refused.
    """
    from guard.inventory.names import classify

    found: dict[tuple[str, str | None], dict[str, Path]] = {}
    for path in sorted(src.iterdir()):
        role = classify(path.name)
        if role.role != "weights" or role.layout != "hf" or role.stem not in _STEMS or role.format not in _FAMILIES:
            continue
        kind = "index" if role.kind == "index" else "single" if role.kind == "file" else "shard"
        found.setdefault((role.format, role.variant), {}).setdefault(kind, path)
    variants = sorted({v for _, v in found if v is not None})
    if not found:
        raise UsageError(f"{src}: no model.safetensors, pytorch_model.bin or flax_model.msgpack (or index) found")
    if variant is None and not any(v is None for _, v in found):
        raise UsageError(f"{src}: no default weights, only the variant(s) {', '.join(variants)}: choose one with "
                         "--variant")
    if variant is not None and variant not in variants:
        listed = ", ".join(variants) if variants else "none"
        raise UsageError(f"{src}: no {variant!r} variant (variants here: {listed})")
    candidates = [fmt for fmt in _FAMILIES if (fmt, variant) in found]
    fmt = next((f for f in candidates if _FAMILIES[f][0] != to), candidates[0])
    files = found[(fmt, variant)]
    if "single" in files and "index" in files and _indexes_only(files["index"], files["single"]):
        del files["index"]  # mlx-lm writes an index for its one shard: one copy, not two
    if "single" in files and "index" in files:
        raise UsageError(f"{src}: both {files['single'].name} and {files['index'].name} hold the same copy; "
                         "remove the stale one (convert will not guess which is current)")
    if "index" not in files and "single" not in files:
        raise UsageError(f"{src}: shards such as {files['shard'].name} without their index: nothing to convert")
    framework, name = _FAMILIES[fmt]
    return framework, name, files.get("single"), files.get("index")


def _indexes_only(index: Path, single: Path) -> bool:
    """True when the index's weight map names no file but ``single`` (mlx-lm's one-shard index)."""
    try:
        with index.open("rb") as fh:
            data = fh.read(64 * 2**20 + 1)  # an index is small; a huge one is not this case
        weight_map = jsonload.loads(data).get("weight_map") if len(data) <= 64 * 2**20 else None
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(weight_map, dict) and bool(weight_map) and set(weight_map.values()) == {single.name}


def open_source(src: Path, *, to: str, variant: str | None = None) -> SourceModel:
    framework, fmt, single, index = choose_layout(src, to=to, variant=variant)
    model = SourceModel(framework, fmt, [], index)
    scans: dict[Path, FileScan] = {}
    if single is not None:
        model.files.append(single)
        scans[single] = scan_local_file(single)  # our headers first: torch never sees a CG003 file
    elif not _check_shards(src, model, scans):
        return model
    loader: Loader = TorchBinLoader() if fmt == "torch-bin" else RangeLoader()
    chunked, ranges = FlaxChunkedLoader(), RangeLoader()
    for path in model.files:
        for info in _list_tensors(path, fmt, model.findings, scans.get(path)):
            use = chunked if fmt == "flax-msgpack" and info.data_start is None else loader
            if fmt == "torch-bin" and info.data_start is not None:
                use = ranges  # a torchao subclass's components, placed by the scanner's walker
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


def _torchao_components(path: Path) -> list[TensorInfo]:
    """A torchao pickle's plain component tensors (``P._weight_qdata``...), each a byte range of the zip:
    read by the scanner's walker (guard.readers.torch), never unpickled."""
    from guard.readers.torch.zip import read_torch_zip
    from guard.sources import LocalFile

    with LocalFile(path, name=str(path)) as source:
        infos = list(read_torch_zip(source, locate_data=True).tensors)
    strided = next((i.name for i in infos if i.stride is not None or i.data_start is None), None)
    if strided is not None:
        raise MalformedCheckpoint(f"tensor {strided!r} is a strided view or not placed; not read by byte range")
    return infos


def _list_tensors(path: Path, fmt: str, findings: list[Finding], scan: FileScan | None) -> list[TensorInfo]:
    if fmt == "torch-bin" and scan is not None and any(f.code in ("CG001", "CG003") for f in scan.findings):
        findings.extend(scan.findings)  # unreadable or unsafe headers: torch never opens the file
        return []
    if fmt == "torch-bin":
        try:
            if scan is not None and "torchao_subclasses" in scan.metadata:
                return _torchao_components(path)  # torch's weights-only loader refuses torchao's classes
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
