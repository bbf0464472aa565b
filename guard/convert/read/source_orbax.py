"""An Orbax checkpoint directory as a conversion source: its leaves, named like Flax msgpack keys."""

from __future__ import annotations

import os
from pathlib import Path

from guard.catalogue import make_finding
from guard.convert.read.io_orbax import OrbaxLeaf, TensorStoreLoader, read_leaf, read_tree
from guard.convert.read.io_torch import RangeLoader
from guard.convert.read.source import SourceModel
from guard.errors import MalformedCheckpoint
from guard.tensors import TensorInfo
from guard.write.orbax_layout import METADATA
from guard.write.plan import SourceTensor

FORMAT = "orbax"


def open_orbax(src: Path) -> SourceModel:
    """Every leaf of ``src/_METADATA``; an unreadable tree or leaf is CG001 naming it."""
    model = SourceModel("flax", FORMAT, [src / METADATA], None)
    try:
        keys, ocdbt, zarr3 = read_tree(src)
    except MalformedCheckpoint as exc:
        model.findings.append(make_finding("CG001", str(src / METADATA), f"unreadable Orbax checkpoint: {exc}"))
        return model
    leaves: list[OrbaxLeaf] = []
    for key in keys:
        try:
            leaves.append(read_leaf(src, key, ocdbt=ocdbt, zarr3=zarr3))
        except MalformedCheckpoint as exc:
            model.findings.append(make_finding("CG001", str(src), f"unreadable Orbax leaf: {exc}",
                                               tensor="/".join(key)))
    specs = {"/".join(leaf.key): leaf.spec for leaf in leaves if leaf.spec is not None}
    ranges, stores = RangeLoader(), TensorStoreLoader(specs)
    for leaf in leaves:
        name = "/".join(leaf.key)
        if leaf.chunk is not None:
            size = leaf.chunk.stat().st_size if leaf.chunk.is_file() else 0  # a zero-size array has no chunk
            info = TensorInfo(name, leaf.code, leaf.shape, str(leaf.chunk), 0, size)
            if size:
                model.files.append(leaf.chunk)
            model.tensors.append(SourceTensor(info, ranges))
        else:
            model.tensors.append(SourceTensor(TensorInfo(name, leaf.code, leaf.shape, str(src)), stores))
    if specs:  # OCDBT data files or compressed chunks, so that bytes_in counts them
        seen = set(model.files)
        for top, _dirs, files in os.walk(src):  # never follows a symlinked directory
            model.files.extend(p for p in sorted(Path(top) / f for f in files)
                               if p not in seen and p.is_file() and not p.is_symlink() and top != str(src))
    return model
