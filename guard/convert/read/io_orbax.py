"""Orbax checkpoints: orbax-checkpoint's StandardCheckpointer layout, written as a stream, read back.

Written: the layout ``StandardCheckpointHandler(use_ocdbt=False)`` produces (orbax 0.12),
one zarr v2 array per leaf in ``<key.joined.by.dots>/`` (``.zarray`` plus one chunk
file holding the C-order bytes), ``_METADATA`` (the tree) and ``_CHECKPOINT_METADATA``.
Chunks are stored uncompressed (``"compressor": null``), so a tensor's bytes stream
straight into its chunk file and ``StandardCheckpointer().restore(DIR)`` returns them
unchanged, bf16 included.  The default OCDBT layout packs every array into a B-tree
of zstd-compressed nodes that only tensorstore can write, one transaction per array
(about 7x slower here), which is why it is read but not written.

Read: the same plain layout by byte ranges (no framework at all), and anything else
orbax writes (OCDBT, zarr3, compressed or multi-chunk arrays) through tensorstore,
one array at a time.  ``_METADATA`` keys are attacker-controlled: each must name a
direct child of the checkpoint directory.
"""

from __future__ import annotations

import os
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guard import dtypes
from guard.errors import MalformedCheckpoint
from guard.records import Record
from guard.sources import LocalFile
from guard.write.orbax_layout import METADATA, ZARR_DTYPES, Key, array_dir, chunk_name

if TYPE_CHECKING:
    import numpy as np


def is_orbax_checkpoint(path: Path) -> bool:
    return (path / METADATA).is_file()


class OrbaxLeaf(Record):
    key: Key
    code: str
    shape: tuple[int, ...]
    chunk: Path | None  # the single uncompressed chunk file, or None: read through tensorstore
    spec: dict[str, Any] | None = None  # tensorstore spec where chunk is None


def read_tree(root: Path) -> tuple[list[Key], bool, bool]:
    """The array leaves of ``_METADATA``, as key tuples, and whether they sit in OCDBT and in zarr3.

    Checked as the scanner's Orbax reader checks them (orbax 0.12's entry format, no leaf outside
    the directory, no two leaves on one array), and each name refused by ``array_dir`` as well.
    """
    from guard.readers.orbax import ARRAY_TYPES, leaf_params, read_metadata_json, tree_metadata

    with LocalFile(root / METADATA, name=METADATA) as source:  # the scanner's read: its size limit, its checks
        meta = read_metadata_json(source, METADATA)
    tree = tree_metadata(meta, METADATA)
    assert isinstance(meta, dict)  # tree_metadata() has checked it
    leaf_params(tree)  # raises MalformedCheckpoint for anything orbax or the scanner would refuse
    keys = [tuple(k["key"] for k in entry["key_metadata"]) for entry in tree.values()  # type: ignore[index]  # leaf_params(tree) above has checked each entry's shape
            if entry["value_metadata"]["value_type"] in ARRAY_TYPES]  # type: ignore[index]  # leaf_params(tree) above has checked each entry's shape
    for key in keys:
        try:
            array_dir(key)
        except ValueError as exc:
            raise MalformedCheckpoint(str(exc)) from None
    # the scanner's rule (guard.readers.orbax): without the key, OCDBT is what a manifest says
    return keys, meta.get("use_ocdbt", (root / "manifest.ocdbt").is_file()) is True, meta.get("use_zarr3") is True


def read_leaf(root: Path, key: Key, *, ocdbt: bool, zarr3: bool) -> OrbaxLeaf:
    """dtype, shape and where the bytes are: a plain chunk file when it holds them raw, else tensorstore."""
    name = array_dir(key)
    if (root / name).exists() and not _inside(root, root / name):
        raise MalformedCheckpoint(f"{'/'.join(key)}: {name} leads outside the checkpoint")
    if not ocdbt and not zarr3:
        meta_path = root / name / ".zarray"
        if not meta_path.is_file():
            raise MalformedCheckpoint(f"{'/'.join(key)}: {name}/.zarray is missing")
        plain = _plain_chunk(_metadata_bytes(meta_path, f"{name}/.zarray"), name)
        if plain is not None:
            code, shape = plain
            chunk = root / name / chunk_name(len(shape))
            if chunk.exists() and not _inside(root, chunk):
                raise MalformedCheckpoint(f"{'/'.join(key)}: {name}/{chunk.name} leads outside the checkpoint")
            size = chunk.stat().st_size if chunk.is_file() else 0
            if size != (dtypes.nbytes(code, prod(shape)) or 0):
                raise MalformedCheckpoint(f"{'/'.join(key)}: {name}/{chunk.name} holds {size} bytes, "
                                          f"not the {dtypes.nbytes(code, prod(shape))} of {code} {list(shape)}")
            return OrbaxLeaf(key, code, shape, chunk)
    return _tensorstore_leaf(root, key, name, ocdbt=ocdbt, zarr3=zarr3)


def _plain_chunk(meta: bytes, name: str) -> tuple[str, tuple[int, ...]] | None:
    """(code, shape) when the array is one raw C-order chunk; None when tensorstore must decode it."""
    from guard.readers.orbax import zarr_dtype_shape, zarr_json

    fields = zarr_json(meta, param=name)
    code, shape = zarr_dtype_shape(fields, zarr3=False, param=name)  # the scanner's checks, and its dtype
    if code not in ZARR_DTYPES:
        raise MalformedCheckpoint(f"{name}: dtype {code} is not one convert can carry")
    chunks = fields["chunks"]
    assert isinstance(chunks, list)  # zarr_dtype_shape has checked it: a list of ints
    single = all(c >= d for c, d in zip(chunks, shape))
    # raw only in the byte order and spelling convert writes: ">f4" parses as F32 but is big-endian
    raw = (fields["compressor"] is None and not fields["filters"] and fields["order"] == "C"
           and fields.get("dtype") == ZARR_DTYPES[code])
    return (code, shape) if (single and raw) or 0 in shape else None


def _tensorstore_leaf(root: Path, key: Key, name: str, *, ocdbt: bool, zarr3: bool) -> OrbaxLeaf:
    try:
        import tensorstore as ts
    except ImportError:
        from guard.errors import MissingExtraError

        raise MissingExtraError("tensorstore", "orbax") from None
    base = {"driver": "file", "path": str(root.resolve()) + "/"}
    kvstore: dict[str, Any] = {"driver": "ocdbt", "base": base, "path": name} if ocdbt else {
        **base, "path": str((root / name).resolve()) + "/"}
    spec = {"driver": "zarr3" if zarr3 else "zarr", "kvstore": kvstore, "open": True}
    try:
        store = ts.open(spec, read=True).result()
    except ValueError as exc:  # tensorstore reports every unreadable array as ValueError
        raise MalformedCheckpoint(f"{'/'.join(key)}: tensorstore cannot open it: {str(exc)[:200]}") from None
    code = dtypes.NUMPY_NAMES.get(store.dtype.numpy_dtype.name)
    if code is None:
        raise MalformedCheckpoint(f"{'/'.join(key)}: dtype {store.dtype.name} is not one convert can carry")
    return OrbaxLeaf(key, code, tuple(int(d) for d in store.shape), None, spec)


class TensorStoreLoader:
    """Reads one whole array through tensorstore (OCDBT, compressed or chunked arrays)."""

    def __init__(self, specs: dict[str, dict[str, Any]]) -> None:
        self._specs = specs

    def load(self, info: Any) -> np.ndarray:
        import numpy as np
        import tensorstore as ts

        try:
            array = ts.open(self._specs[info.name], read=True).result().read().result()
        except ValueError as exc:
            raise MalformedCheckpoint(f"{info.name}: tensorstore cannot read it: {str(exc)[:200]}") from None
        return np.ascontiguousarray(array).reshape(info.shape)


def _metadata_bytes(path: Path, name: str) -> bytes:
    from guard.readers.orbax import read_metadata_bytes

    with LocalFile(path, name=name) as source:
        return read_metadata_bytes(source, name)


def _inside(root: Path, path: Path) -> bool:
    """``path`` resolves below ``root``: a symlinked leaf never reads another directory."""
    return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)
