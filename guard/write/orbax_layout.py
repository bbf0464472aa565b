"""The Orbax layout the writer produces: what ``StandardCheckpointHandler(use_ocdbt=False)`` writes (orbax 0.12).

One zarr v2 array per leaf in ``<key.joined.by.dots>/`` (``.zarray`` plus one chunk file
holding the C-order bytes, ``"compressor": null``), ``_METADATA`` (the tree) and
``_CHECKPOINT_METADATA``.  The reader (``guard.convert.read.io_orbax``) checks sources
against the same names.
"""

from __future__ import annotations

import json
import re

Key = tuple[str, ...]
METADATA = "_METADATA"
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
HANDLER = "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler"
# Files and directories orbax itself keeps at the top of a checkpoint: no leaf may be named so.
RESERVED = frozenset({METADATA, CHECKPOINT_METADATA, "_sharding", "commit_success.txt", "manifest.ocdbt", "d",
                      "array_metadatas", "descriptor"})
ZARR_DTYPES = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2", "U32": "<u4", "I32": "<i4",
    "U64": "<u8", "I64": "<i8", "F16": "<f2", "F32": "<f4", "F64": "<f8", "C64": "<c8", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
}
_SAFE_PART = re.compile(r"^[^/\\\x00]+$")


def array_dir(key: Key) -> str:
    """The leaf's directory, as orbax names it; refused where it could leave or clobber the checkpoint."""
    name = ".".join(key)
    if (not key or any(not _SAFE_PART.match(p) or p in (".", "..") for p in key) or name in RESERVED
            or name.startswith(("ocdbt.process_", ".")) or name.endswith((".json", ".txt"))):
        raise ValueError(f"{'/'.join(key)!r} cannot be an Orbax leaf name (it would leave or clobber the checkpoint)")
    return name


def chunk_name(ndim: int) -> str:
    return ".".join("0" for _ in range(ndim)) or "0"


def zarray(code: str, shape: tuple[int, ...]) -> bytes:
    meta = {"chunks": [max(1, d) for d in shape], "compressor": None, "dimension_separator": ".",
            "dtype": ZARR_DTYPES[code], "fill_value": None, "filters": None, "order": "C",
            "shape": list(shape), "zarr_format": 2}
    return json.dumps(meta, sort_keys=True).encode()


def tree_metadata(keys: list[Key]) -> bytes:
    tree = {repr(tuple(k)): {"key_metadata": [{"key": p, "key_type": 2} for p in k],
                             "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}}
            for k in keys}
    meta = {"tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False,
            "store_array_data_equal_to_fill_value": True, "custom_metadata": None}
    return json.dumps(meta).encode()


def checkpoint_metadata(started_ns: int, committed_ns: int) -> bytes:
    return json.dumps({"item_handlers": HANDLER, "metrics": {}, "performance_metrics": {},
                       "init_timestamp_nsecs": started_ns, "commit_timestamp_nsecs": committed_ns,
                       "custom_metadata": {}}).encode()
