"""MaxText's checkpoint layout: a step directory of an Orbax CheckpointManager, its ``items`` a PyTree.

What orbax-checkpoint 0.12.8 writes for ``CheckpointManager(item_names=("items",))`` and a
``PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)`` (MaxText's
``checkpoint_storage_use_ocdbt`` / ``_zarr3`` defaults): ``<root>/0/_CHECKPOINT_METADATA``,
``<root>/0/items/_METADATA`` (the tree; each leaf an ``np.ndarray``), and every array a zarr3
array inside one OCDBT database at ``<root>/0/items`` (``manifest.ocdbt``, ``d/``), named by
its key joined with dots, one ``sharding_indexed`` chunk as orbax writes it, but with no
zstd inside: readers (orbax, MaxText) take the codecs from each array's ``zarr.json``, and
orbax's zstd level 3 cost 4x the time here (64 MiB of bf16 weights: 1.13 s, against 0.28 s
without it) for weights it barely shrinks.  Written
array by array through tensorstore, so memory holds one leaf.
``_METADATA``'s ``custom_metadata`` (orbax's own field) records the HF config and the
mapping, for the way back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guard.errors import MalformedCheckpoint

if TYPE_CHECKING:
    import numpy as np

STEP = "0"
ITEM = "items"
HANDLER = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
OCDBT_CONFIG = {"max_inline_value_bytes": 1024, "max_decoded_node_bytes": 100_000_000,
                "version_tree_arity_log2": 4, "compression": {"id": "zstd"}}  # orbax 0.12's choice
CUSTOM_KEY = "ckpt_guard"


def items_dir(root: Path) -> Path:
    return root / STEP / ITEM


def zarr3_metadata(dtype: str, shape: tuple[int, ...]) -> dict[str, Any]:
    chunk = [max(1, d) for d in shape]
    return {"zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": dtype, "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
            "chunk_key_encoding": {"name": "default"},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": chunk,
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],  # see CODECS below
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]}


class ItemsWriter:
    """One OCDBT database; ``write`` stores one array (a transaction of its own) and remembers its key."""

    def __init__(self, items: Path) -> None:
        import tensorstore as ts

        items.mkdir(parents=True)
        self._items = items
        # no fsync per OCDBT commit (one per array cost 0.2-0.3 s here: 2x the whole conversion of a 1.5 GB
        # model); ``finish`` fsyncs every file and directory once, before the output may be published
        self._context = ts.Context({"file_io_sync": False})
        self._keys: list[tuple[str, ...]] = []

    def _spec(self, key: tuple[str, ...]) -> dict[str, Any]:
        return {"driver": "ocdbt", "base": {"driver": "file", "path": str(self._items) + "/"},
                "path": ".".join(key) + "/", "config": OCDBT_CONFIG}

    def write(self, key: tuple[str, ...], array: np.ndarray) -> None:
        import tensorstore as ts

        spec = {"driver": "zarr3", "kvstore": self._spec(key), "create": True, "store_data_equal_to_fill_value": True,
                "metadata": zarr3_metadata(array.dtype.name, array.shape)}
        import numpy as np

        store = ts.open(spec, context=self._context).result()
        store.write(np.ascontiguousarray(array)).result()  # a transposed view: 2x slower through tensorstore
        self._keys.append(key)

    def finish(self, custom: dict[str, Any], started_ns: int) -> None:
        """``_METADATA`` for the tree, then the step's ``_CHECKPOINT_METADATA`` (orbax writes it last)."""
        tree = {repr(k): {"key_metadata": [{"key": p, "key_type": 2} for p in k],
                          "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}}
                for k in self._keys}
        meta = {"tree_metadata": tree, "use_ocdbt": True, "use_zarr3": True,
                "store_array_data_equal_to_fill_value": True, "custom_metadata": {CUSTOM_KEY: custom}}
        (self._items / "_METADATA").write_text(json.dumps(meta), encoding="utf-8")
        step = self._items.parent
        (step / "_CHECKPOINT_METADATA").write_text(json.dumps({
            "item_handlers": {ITEM: HANDLER}, "metrics": {}, "performance_metrics": {},
            "init_timestamp_nsecs": started_ns, "commit_timestamp_nsecs": time.time_ns(), "custom_metadata": {}}),
            encoding="utf-8")
        _fsync_tree(step)


def _fsync_tree(top: Path) -> None:
    """Every file's data, then every directory (so that the new names are durable before the rename)."""
    import os

    from guard.write.publish import fsync_paths

    files: list[Path] = []
    dirs: list[Path] = []
    for parent, _subdirs, names in os.walk(top):
        files.extend(Path(parent) / n for n in names)
        dirs.append(Path(parent))
    fsync_paths(files + dirs[::-1])


def find_items(path: Path) -> Path | None:
    """``path`` itself (``OUT/0/items``), or the items of its one step (``OUT``); None when it is neither."""
    for candidate in (path, items_dir(path)):
        if (candidate / "_METADATA").is_file() and (candidate / "manifest.ocdbt").is_file():
            return candidate
    return None


def _metadata(items: Path) -> dict[str, Any]:
    from guard.readers.orbax import read_metadata_json
    from guard.sources import LocalFile

    with LocalFile(items / "_METADATA", name="_METADATA") as source:  # the scanner's read: its limits and checks
        meta = read_metadata_json(source, "_METADATA")
    if not isinstance(meta, dict):
        raise MalformedCheckpoint(f"{items / '_METADATA'} is not a JSON object")
    return meta


def is_maxtext_tree(items: Path) -> bool:
    """Every leaf under ``params/params``: MaxText's tree, not another Orbax checkpoint in OCDBT."""
    try:
        tree = _metadata(items).get("tree_metadata")
    except (MalformedCheckpoint, OSError):
        return False
    return isinstance(tree, dict) and bool(tree) and all(k.startswith("('params', 'params', ") for k in tree)


def read_custom(items: Path) -> dict[str, Any] | None:
    custom = _metadata(items).get("custom_metadata")
    found = custom.get(CUSTOM_KEY) if isinstance(custom, dict) else None
    return found if isinstance(found, dict) else None


class ItemsReader:
    """Arrays of an OCDBT items directory by key, one open array at a time."""

    def __init__(self, items: Path) -> None:
        import tensorstore as ts

        self._items = items
        self._context = ts.Context()

    def read(self, key: tuple[str, ...]) -> np.ndarray:
        import numpy as np
        import tensorstore as ts

        spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": {"driver": "file",
                                                                            "path": str(self._items) + "/"},
                                               "path": ".".join(key) + "/"}, "open": True}
        try:
            return np.asarray(ts.open(spec, read=True, context=self._context).result().read().result())
        except ValueError as exc:  # tensorstore reports every unreadable array as ValueError
            raise MalformedCheckpoint(f"{'/'.join(key)}: tensorstore cannot read it: {str(exc)[:200]}") from None
