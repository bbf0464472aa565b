"""HDF5 (tf_model.h5, Keras .weights.h5, legacy Keras-2 .h5): every dataset's dtype and shape.

h5py (the ``hdf5`` extra) reads the object headers, never a dataset's data, in a
worker process (``hdf5_worker``: libhdf5 may hang or crash on hostile bytes)
that asks this process for each byte range, so a Hub file is read with ranged
requests.  Without h5py a file is CG006 with the install hint.  The walk itself
(``hdf5_walk``) is bounded in objects and depth; a hang or crash is CG001.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.sources import ByteSource, CountingSource
from guard.tensors import FileScan, TensorInfo

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# The superblock sits at 0 or after a user block of 512, 1024, 2048, ... bytes.
SNIFF_LIMIT = 64 * 1024
INSTALL_HINT = "pip install 'ckpt-guard[hdf5]'"


def superblock_offset(source: ByteSource, *, limit: int = SNIFF_LIMIT) -> int | None:
    """Where the HDF5 signature is (0, 512, 1024, ...), or None."""
    offset = 0
    while offset + len(HDF5_MAGIC) <= min(source.size, limit + len(HDF5_MAGIC)):
        if source.read_at(offset, len(HDF5_MAGIC)) == HDF5_MAGIC:
            return offset
        offset = 512 if offset == 0 else offset * 2
    return None


def have_h5py() -> bool:
    try:
        return importlib.util.find_spec("h5py") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["h5py"] is None
        return False


def read_hdf5(source: ByteSource) -> FileScan:
    if not have_h5py():
        return missing_h5py(source)
    return walk_hdf5(source)


def missing_h5py(source: ByteSource, what: str = "an HDF5 file") -> FileScan:
    finding = make_finding("CG006", source.name, f"{what}; reading it needs h5py: {INSTALL_HINT}")
    return FileScan(path=source.name, format=None, size=source.size, findings=(finding,),
                    bytes_read=getattr(source, "bytes_read", 0))


def walk_hdf5(source: ByteSource, *, fmt: str = "hdf5", path: str | None = None) -> FileScan:
    """The datasets of an HDF5 file, as TensorInfo records named by their HDF5 path."""
    from guard.readers.hdf5.worker import walk_in_worker

    if source.size < len(HDF5_MAGIC):
        raise MalformedCheckpoint(f"file is {source.size} bytes, too short for HDF5")
    counted = CountingSource(source)  # what the walk asked for: the FileScan's bytes_read
    result = walk_in_worker(counted)
    return file_scan(result, counted, fmt=fmt, path=path or source.name)


def file_scan(result: dict[str, Any], source: ByteSource, *, fmt: str, path: str) -> FileScan:
    if "error" in result:
        raise MalformedCheckpoint(str(result["error"])[:300])
    tensors = [TensorInfo(name, dataset_code(kind, itemsize, declared, typestr), tuple(shape), path)
               for name, kind, itemsize, declared, shape, typestr in result["datasets"]]
    return FileScan(path=path, format=fmt, size=source.size, tensors=tuple(tensors),
                    findings=tuple(unknown_dtype_findings(path, tensors)),
                    metadata=_layout(result["attrs"]), bytes_read=getattr(source, "bytes_read", 0))


def dataset_code(kind: str, itemsize: int, declared: str | None, typestr: str) -> str:
    from guard.readers.hdf5.walk import NUMPY_KINDS

    if kind == "V" and declared is not None:
        # Keras 3 stores dtypes h5py lacks (bfloat16, float8_*) as opaque bytes plus a dtype attribute
        code = dtypes.NUMPY_NAMES.get(declared)
        info = dtypes.DTYPES.get(code or "")
        return code if code and info and info.bits == 8 * itemsize else f"{declared} (opaque {itemsize}-byte)"
    return NUMPY_KINDS.get((kind, itemsize)) or f"hdf5:{typestr}"


def unknown_dtype_findings(file: str, tensors: list[TensorInfo]) -> list[Finding]:
    unknown: dict[str, list[str]] = {}
    for tensor in tensors:
        if tensor.dtype not in dtypes.DTYPES:
            unknown.setdefault(tensor.dtype, []).append(tensor.name)
    return [make_finding("CG005", file, f"unknown dtype {code!r} on {len(names)} tensor(s), "
                         f"e.g. {shown(names[0])}", tensor=names[0])
            for code, names in unknown.items()]


def _layout(root_attrs: dict[str, str]) -> dict[str, str]:
    meta = {k: v for k, v in root_attrs.items() if k != "layer_names"}
    if "layer_names" in root_attrs:
        meta["hdf5_layout"] = "keras2"  # TF2 save_weights / transformers tf_model.h5
        meta["layers"] = root_attrs["layer_names"]
    return meta
