"""HDF5 (tf_model.h5, Keras .weights.h5, legacy Keras-2 .h5): every dataset's dtype and shape.

h5py (the ``hdf5`` extra) reads the object headers through a read-only file
object over the ByteSource, so a Hub file is read with ranged requests and no
dataset's data is ever read.  Without h5py a file is CG006 with the install
hint.  The walk is bounded: H5Ovisit visits each object once (a hard-link cycle
ends), soft and external links are never followed, and a file with more objects
or deeper groups than a checkpoint has is CG001.
"""

from __future__ import annotations

import io
from typing import Any

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# The superblock sits at 0 or after a user block of 512, 1024, 2048, ... bytes; sniffing
# looks this far, which a single 64 KiB read-ahead block covers remotely.
SNIFF_LIMIT = 64 * 1024
MAX_OBJECTS = 20_000  # a Keras LLM or tf_model.h5 has a few thousand objects; ~60 µs each
MAX_DEPTH = 64
INSTALL_HINT = "pip install 'ckpt-guard[hdf5]'"

# numpy (kind, itemsize) of an HDF5 dataset -> safetensors code
_NUMPY_KINDS: dict[tuple[str, int], str] = {
    ("f", 2): "F16", ("f", 4): "F32", ("f", 8): "F64",
    ("i", 1): "I8", ("i", 2): "I16", ("i", 4): "I32", ("i", 8): "I64",
    ("u", 1): "U8", ("u", 2): "U16", ("u", 4): "U32", ("u", 8): "U64",
    ("b", 1): "BOOL", ("c", 8): "C64",
}


def superblock_offset(source: ByteSource, *, limit: int = SNIFF_LIMIT) -> int | None:
    """Where the HDF5 signature is (0, 512, 1024, ...), or None."""
    offset = 0
    while offset + len(HDF5_MAGIC) <= min(source.size, limit + len(HDF5_MAGIC)):
        if source.read_at(offset, len(HDF5_MAGIC)) == HDF5_MAGIC:
            return offset
        offset = 512 if offset == 0 else offset * 2
    return None


class SourceFile(io.RawIOBase):
    """A read-only, seekable file object over a ByteSource, for h5py's fileobj driver.

    h5py swallows a Python exception raised in ``readinto`` into an HDF5 error, so the
    first one is kept in ``error`` and re-raised by the reader (a remote budget stays CG401).
    """

    def __init__(self, source: ByteSource) -> None:
        super().__init__()
        self.source = source
        self.position = 0
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.source.size}[whence]
        if base + offset < 0:
            raise OSError("negative seek position")
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        size = min(len(buffer), max(0, self.source.size - self.position))
        try:
            data = self.source.read_at(self.position, size)
        except BaseException as exc:
            self.error = self.error or exc
            raise
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def read_hdf5(source: ByteSource) -> FileScan:
    try:
        import h5py
    except ImportError:
        return missing_h5py(source)
    scan, _root_attrs = walk_hdf5(source, h5py)
    return scan


def missing_h5py(source: ByteSource, what: str = "an HDF5 file") -> FileScan:
    finding = make_finding("CG006", source.name,
                           f"{what}; reading it needs h5py: {INSTALL_HINT}")
    return FileScan(path=source.name, format=None, size=source.size, findings=(finding,),
                    bytes_read=getattr(source, "bytes_read", 0))


def walk_hdf5(source: ByteSource, h5py: Any, *, fmt: str = "hdf5", path: str | None = None
              ) -> tuple[FileScan, dict[str, str]]:
    """The datasets of an HDF5 file, and its root attributes (as short strings)."""
    handle = SourceFile(source)
    found: list[tuple[str, Any]] = []
    try:
        with h5py.File(handle, "r") as f:
            root_attrs = _short_attrs(f.attrs)
            problem = _visit(f, h5py, found)
            if problem is None:
                described = [_describe(name, obj, path or source.name) for name, obj in found]
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        if handle.error is not None and not isinstance(handle.error, MalformedCheckpoint):
            raise handle.error from None  # e.g. the remote read budget: CG401, not CG001
        reason = str(handle.error or exc).splitlines()[0] if str(handle.error or exc) else type(exc).__name__
        raise MalformedCheckpoint(f"HDF5: {reason[:200]}") from None
    if problem is not None:
        raise MalformedCheckpoint(problem)
    tensors = [t for t in described if t is not None]
    return FileScan(path=path or source.name, format=fmt, size=source.size, tensors=tuple(tensors),
                    findings=tuple(unknown_dtype_findings(path or source.name, tensors)),
                    metadata=_layout(root_attrs), bytes_read=getattr(source, "bytes_read", 0)), root_attrs


def _visit(f: Any, h5py: Any, found: list[tuple[str, Any]]) -> str | None:
    count = 0

    def visit(name: str, obj: Any) -> str | None:
        nonlocal count
        count += 1
        if count > MAX_OBJECTS:
            return f"more than {MAX_OBJECTS:,} HDF5 objects"
        if name.count("/") >= MAX_DEPTH:
            return f"groups nested more than {MAX_DEPTH} deep"
        if isinstance(obj, h5py.Dataset):
            found.append((name, obj))
        return None

    result: str | None = f.visititems(visit)
    return result


def _describe(name: str, obj: Any, file: str) -> TensorInfo | None:
    shape = obj.shape
    if shape is None:  # a null dataspace holds no values
        return None
    dtype = obj.dtype
    code = _NUMPY_KINDS.get((dtype.kind, dtype.itemsize))
    if dtype.kind == "V" and not dtype.names:
        # Keras 3 stores dtypes h5py lacks (bfloat16, float8_*) as opaque bytes plus an attribute
        declared = obj.attrs.get("dtype") if "dtype" in obj.attrs else None
        if isinstance(declared, bytes):
            declared = declared.decode("utf-8", "replace")
        if isinstance(declared, str):
            code = dtypes.NUMPY_NAMES.get(declared)
            info = dtypes.DTYPES.get(code or "")
            if info is None or info.bits != 8 * dtype.itemsize:
                code = f"{declared} (opaque {dtype.itemsize}-byte)"
    if code is None:
        code = f"hdf5:{dtype.str}"
    return TensorInfo(name, code, tuple(int(d) for d in shape), file)


def unknown_dtype_findings(file: str, tensors: list[TensorInfo]) -> list[Finding]:
    unknown: dict[str, list[str]] = {}
    for tensor in tensors:
        if tensor.dtype not in dtypes.DTYPES:
            unknown.setdefault(tensor.dtype, []).append(tensor.name)
    return [make_finding("CG005", file, f"unknown dtype {code!r} on {len(names)} tensor(s), "
                         f"e.g. {shown(names[0])}", tensor=names[0])
            for code, names in unknown.items()]


def _short_attrs(attrs: Any) -> dict[str, str]:
    """Root attributes that name the writer (Keras 2: backend, keras_version, layer_names)."""
    out: dict[str, str] = {}
    for key in ("backend", "keras_version", "layer_names"):
        if key in attrs:
            value = attrs[key]
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            out[key] = str(value)[:200] if key != "layer_names" else str(len(value))
    return out


def _layout(root_attrs: dict[str, str]) -> dict[str, str]:
    meta = {k: v for k, v in root_attrs.items() if k != "layer_names"}
    if "layer_names" in root_attrs:
        meta["hdf5_layout"] = "keras2"  # TF2 save_weights / transformers tf_model.h5
        meta["layers"] = root_attrs["layer_names"]
    return meta
