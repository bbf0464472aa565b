"""Orbax checkpoint directories (orbax-checkpoint 0.11/0.12): one FileScan per checkpoint step.

``_METADATA`` (JSON) names every leaf (``key_metadata``) and its ``value_type``
and ``write_shape`` (the shape one process writes: the global shape only when a
single process saved it), but no dtype.  dtype and global shape live in each
array's zarr metadata: ``<param>/.zarray`` (zarr 2) or ``<param>/zarr.json``
(zarr 3).  With OCDBT off those are plain files; with OCDBT (the default) they
are values in the OCDBT B-tree, read with tensorstore (the ``orbax`` extra) as a
key-value store: only the metadata keys, never a chunk.

The B-tree nodes, with small values such as the zarr metadata inline, sit in
the small files of ``d/`` and ``ocdbt.process_N/d/``; array chunks fill the
large ones.  So the small files (each <= ``SMALL_FILE``, together <=
``COPY_BUDGET``) are copied into a tensorstore ``memory://`` store and the
metadata is read from there: the same path for a local directory and a Hub
listing, and tensorstore sees no file outside the checkpoint.  If a needed node
is in a file that was not copied, a local checkpoint is read from its
directory (``local_root``) instead; a remote one gets CG401 (scan it locally).

A leaf's path is its tree keys joined with ".", which orbax also uses as the
array's directory; a key that makes it absolute or climb out with ".." is
CG001, and no file is ever opened that is not in ``files``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping

from guard import dtypes, jsonload
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import shown
from guard.readers.hdf5.file import unknown_dtype_findings
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

METADATA = "_METADATA"
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
MAX_JSON = 64 * 1024 * 1024
MAX_LEAVES = 200_000
MAX_RANK = 64
SMALL_FILE = 1024 * 1024
COPY_BUDGET = 32 * 1024 * 1024
INSTALL_HINT = "pip install 'ckpt-guard[orbax]'"
ARRAY_TYPES = ("jax.Array", "np.ndarray", "scalar")  # saved as zarr arrays; strings go to JSON
_OCDBT_FILE = re.compile(r"^(ocdbt\.process_[^/]+/)?(manifest\.ocdbt|d/[^/]+)$")
_TYPESTR = {"f2": "F16", "f4": "F32", "f8": "F64", "i1": "I8", "i2": "I16", "i4": "I32", "i8": "I64",
            "u1": "U8", "u2": "U16", "u4": "U32", "u8": "U64", "b1": "BOOL", "c8": "C64"}

OpenFile = Callable[[str], ByteSource]


class NeedsLocalScan(Exception):
    """The OCDBT metadata is not in the checkpoint's small files (CG401 remotely)."""


class MissingTensorstore(Exception):
    pass


def is_orbax_checkpoint(names: Collection[str]) -> bool:
    """A PyTree checkpoint (``_METADATA``) or a CheckpointManager step (items with their own)."""
    return METADATA in names or (CHECKPOINT_METADATA in names and any(_item_of(n) for n in names))


def _item_of(name: str) -> str | None:
    head, sep, tail = name.partition("/")
    return head if sep and tail == METADATA else None


def read_orbax_checkpoint(display_path: str, files: Mapping[str, int], open_file: OpenFile, *,
                          local_root: str | None = None) -> FileScan:
    """Never raises for a problem in the checkpoint: CG001, CG005, CG006 or CG401 findings."""
    from guard.readers import READ_FAILURES

    size = sum(files.values())
    try:
        tensors, metadata = _read(files, open_file, local_root, display_path)
    except MissingTensorstore:
        return _only(display_path, size, "CG006", "an Orbax checkpoint stored with OCDBT; reading its "
                                                  f"metadata needs tensorstore: {INSTALL_HINT}")
    except NeedsLocalScan as exc:
        return _only(display_path, size, "CG401", f"not scannable through ranged reads: {exc}; "
                                                  "scan it locally after download")
    except READ_FAILURES as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        return _only(display_path, size, "CG001", f"unreadable Orbax checkpoint: {reason}")
    return FileScan(path=display_path, format="orbax", size=size, tensors=tuple(tensors),
                    findings=tuple(unknown_dtype_findings(display_path, tensors)), metadata=metadata)


def _only(path: str, size: int, code: str, message: str) -> FileScan:
    return FileScan(path=path, format=None, size=size, findings=(make_finding(code, path, message),))


def _read(files: Mapping[str, int], open_file: OpenFile, local_root: str | None,
          display: str) -> tuple[list[TensorInfo], dict[str, str]]:
    items = [""] if METADATA in files else sorted({i for n in files if (i := _item_of(n))})
    if not items:
        raise MalformedCheckpoint(f"no {METADATA} file")
    tensors: list[TensorInfo] = []
    kinds: set[str] = set()
    for item in items:
        prefix = f"{item}/" if item else ""
        tree = _json(files, open_file, prefix + METADATA)
        params = leaf_params(tree_metadata(tree, prefix + METADATA))
        ocdbt = tree.get("use_ocdbt", f"{prefix}manifest.ocdbt" in files) is True
        zarr3 = tree.get("use_zarr3") is True
        meta_name = "zarr.json" if zarr3 else ".zarray"
        keys = {p: f"{p}/{meta_name}" for p in params}
        kinds.add(("ocdbt+" if ocdbt else "") + ("zarr3" if zarr3 else "zarr2"))
        if ocdbt:
            blobs = read_ocdbt_values(prefix, files, open_file, list(keys.values()),
                                      local_root=f"{local_root}/{item}" if local_root and item else local_root)
        else:
            blobs = {k: read_metadata_bytes(open_file(prefix + k), k, size=files[prefix + k])
                     if prefix + k in files else None for k in keys.values()}
        for param, key in keys.items():
            blob = blobs.get(key)
            if blob is None:
                raise MalformedCheckpoint(f"array {shown(param)} has no {meta_name}")
            code, shape = parse_zarr_metadata(blob, zarr3=zarr3, param=param)
            tensors.append(TensorInfo(f"{item}.{param}" if item else param, code, shape, display))
    return tensors, {"orbax_layout": "+".join(sorted(kinds)), "orbax_items": ",".join(items)[:200]}


def leaf_params(tree_metadata: dict[str, object]) -> list[str]:
    """The array leaves' parameter names (keys joined by "."), checked to stay inside the directory.

    Entries are read as orbax 0.12 writes (and reads) them: ``key_metadata`` a list of
    ``{"key", "key_type": 1 (sequence) | 2 (dict)}``, ``value_metadata`` with ``value_type`` and
    ``skip_deserialize``; orbax refuses an entry without them, so do we.
    """
    if len(tree_metadata) > MAX_LEAVES:
        raise MalformedCheckpoint(f"more than {MAX_LEAVES:,} leaves in {METADATA}")
    params: list[str] = []
    for tree_key, entry in tree_metadata.items():
        value = entry.get("value_metadata") if isinstance(entry, dict) else None
        keys = _keys(entry.get("key_metadata") if isinstance(entry, dict) else None)
        if (keys is None or not isinstance(value, dict) or not isinstance(value.get("value_type"), str)
                or not isinstance(value.get("skip_deserialize"), bool)
                or not isinstance(value.get("write_shape", []), list)):
            raise MalformedCheckpoint(f"{METADATA} entry {shown(tree_key)} has no valid key_metadata "
                                      "and value_metadata")
        for key in filter(None, keys):  # no tree key of a real model is a path; refuse those that are
            _check_inside(key)
        param = ".".join(keys)
        _check_inside(param)
        if value["value_type"] in ARRAY_TYPES:
            params.append(param)
    if len(set(params)) != len(params):
        raise MalformedCheckpoint(f"two leaves of {METADATA} share one array path")
    return params


def _keys(key_metadata: object) -> list[str] | None:
    if not isinstance(key_metadata, list) or not key_metadata:
        return None
    keys = []
    for item in key_metadata:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str) or item.get("key_type") not in (1, 2):
            return None
        keys.append(item["key"])
    return keys


def _check_inside(param: str) -> None:
    parts = param.replace("\\", "/").split("/")
    if (not param or param.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", param)
            or ".." in parts or "\x00" in param):
        raise MalformedCheckpoint(
            f"{METADATA} leaf {shown(param)} names a path outside the checkpoint (absolute or '..')")


def tree_metadata(meta: object, name: str) -> dict[str, object]:
    """``_METADATA``'s ``tree_metadata`` object (its entries are ``leaf_params``'s to check)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("tree_metadata"), dict):
        raise MalformedCheckpoint(f"{name} has no tree_metadata object")
    return meta["tree_metadata"]


def parse_zarr_metadata(blob: bytes, *, zarr3: bool, param: str) -> tuple[str, tuple[int, ...]]:
    return zarr_dtype_shape(zarr_json(blob, param=param), zarr3=zarr3, param=param)


def zarr_json(blob: bytes, *, param: str) -> dict[str, object]:
    """A ``.zarray`` / ``zarr.json`` parsed: an object, or MalformedCheckpoint."""
    try:
        meta = jsonload.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise MalformedCheckpoint(f"zarr metadata of {shown(param)} is not JSON") from None
    if not isinstance(meta, dict):
        raise MalformedCheckpoint(f"zarr metadata of {shown(param)} is not an object")
    return meta


def zarr_dtype_shape(meta: dict[str, object], *, zarr3: bool, param: str) -> tuple[str, tuple[int, ...]]:
    """dtype code and shape of parsed zarr metadata, after the fields tensorstore requires are checked."""
    raw = meta.get("data_type" if zarr3 else "dtype")
    shape = meta.get("shape")
    if not isinstance(raw, str) or not isinstance(shape, list) or len(shape) > MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise MalformedCheckpoint(f"zarr metadata of {shown(param)} has no valid dtype and shape")
    _check_zarr_fields(meta, zarr3=zarr3, rank=len(shape), param=param)
    code = _TYPESTR.get(raw.lstrip("<>|=")) if raw[:1] in "<>|=" else dtypes.NUMPY_NAMES.get(raw)
    return code or f"zarr:{raw[:40]}", tuple(shape)


def _check_zarr_fields(meta: dict[str, object], *, zarr3: bool, rank: int, param: str) -> None:
    """The structural fields tensorstore requires before it opens the array (cheap to check)."""
    if zarr3:
        grid, keys, codecs = meta.get("chunk_grid"), meta.get("chunk_key_encoding"), meta.get("codecs")
        config = grid.get("configuration") if isinstance(grid, dict) else None
        chunk_shape = config.get("chunk_shape") if isinstance(config, dict) else None
        ok = (meta.get("zarr_format") == 3 and meta.get("node_type") == "array"
              and isinstance(grid, dict) and grid.get("name") == "regular" and _dims(chunk_shape, rank)
              and isinstance(keys, dict) and isinstance(keys.get("name"), str)
              and isinstance(codecs, list) and all(isinstance(c, dict) for c in codecs))
    else:  # zarr 2 metadata has every member (tensorstore refuses a missing one)
        ok = (meta.get("zarr_format") == 2 and _dims(meta.get("chunks"), rank)
              and "compressor" in meta and (meta["compressor"] is None or isinstance(meta["compressor"], dict))
              and meta.get("order") in ("C", "F") and "fill_value" in meta
              and "filters" in meta and (meta["filters"] is None or isinstance(meta["filters"], list)))
    if not ok:
        raise MalformedCheckpoint(f"zarr metadata of {shown(param)} is not zarr {3 if zarr3 else 2} array metadata")


def _dims(value: object, rank: int) -> bool:
    return isinstance(value, list) and len(value) == rank and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value)


def read_ocdbt_values(prefix: str, files: Mapping[str, int], open_file: OpenFile, keys: list[str], *,
                      local_root: str | None) -> dict[str, bytes | None]:
    """The values of ``keys`` in the checkpoint's OCDBT store (metadata keys only)."""
    try:
        import tensorstore as ts
    except ImportError:
        raise MissingTensorstore from None
    context = ts.Context()
    memory = ts.KvStore.open({"driver": "memory"}, context=context).result()
    ocdbt = sorted((n for n in files if n.startswith(prefix) and _OCDBT_FILE.match(n[len(prefix):])),
                   key=lambda n: files[n])
    copied, skipped = 0, 0
    for name in ocdbt:
        if files[name] > SMALL_FILE or copied + files[name] > COPY_BUDGET:
            skipped += 1
            continue
        memory[name[len(prefix):]] = read_metadata_bytes(open_file(name), name, size=files[name])
        copied += files[name]
    try:
        values = _ocdbt_read(ts, {"driver": "memory"}, context, keys)
    except ValueError as exc:  # tensorstore's errors (NOT_FOUND, DATA_LOSS, ...) are ValueErrors
        if not skipped:
            raise MalformedCheckpoint(f"OCDBT: {_ts_reason(exc)}") from None
        values = {}
    if not skipped or all(values.get(key) is not None for key in keys):
        return values
    # a node or a value lies in a file that was not copied
    if local_root is None:
        raise NeedsLocalScan(f"its OCDBT index lies in files over {SMALL_FILE // 1024} KiB")
    try:
        return _ocdbt_read(ts, f"file://{local_root}/", ts.Context(), keys)
    except ValueError as exc:
        raise MalformedCheckpoint(f"OCDBT: {_ts_reason(exc)}") from None


def _ocdbt_read(ts: object, base: object, context: object, keys: list[str]) -> dict[str, bytes | None]:
    store = ts.KvStore.open({"driver": "ocdbt", "base": base}, context=context).result()  # type: ignore[attr-defined]  # tensorstore's KvStore, which its stubs leave out
    futures = {key: store.read(key) for key in keys}
    out: dict[str, bytes | None] = {}
    for key, future in futures.items():
        result = future.result()
        out[key] = bytes(result.value) if result.state == "value" else None
    return out


def _ts_reason(exc: BaseException) -> str:
    return (str(exc).split(" [source locations", 1)[0].splitlines() or ["tensorstore error"])[0][:200]


def _json(files: Mapping[str, int], open_file: OpenFile, name: str) -> dict[str, object]:
    if name not in files:
        raise MalformedCheckpoint(f"no {name}")
    tree = read_metadata_json(open_file(name), name, size=files[name])
    if not isinstance(tree, dict):  # what tree_metadata() says of it
        raise MalformedCheckpoint(f"{name} has no tree_metadata object")
    return tree


def read_metadata_json(source: ByteSource, name: str, *, size: int | None = None) -> object:
    """A metadata file (``_METADATA``, ``_CHECKPOINT_METADATA``) parsed, within the one size limit.

    ``size`` is the listing's figure where there is one (a Hub listing): the limit applies to it
    before anything is read.  Conversion reads a checkpoint's metadata through this too.
    """
    try:
        return jsonload.loads(read_metadata_bytes(source, name, size=size).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedCheckpoint(f"{name} is not valid JSON ({str(exc)[:100]})") from None


def read_metadata_bytes(source: ByteSource, name: str, *, size: int | None = None) -> bytes:
    """A metadata file's bytes (JSON, zarr metadata), refused past ``MAX_JSON``."""
    size = source.size if size is None else size
    if size > MAX_JSON:
        raise MalformedCheckpoint(f"{name} is {size:,} bytes, over the {MAX_JSON:,}-byte metadata limit")
    return source.read_at(0, min(size, source.size))

