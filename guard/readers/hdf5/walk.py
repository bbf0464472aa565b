"""The h5py side of the HDF5 reader: runs in the worker process (guard.readers.hdf5.worker).

libhdf5 is C: on a malformed file it can loop without end or crash (a vlen
attribute whose global-heap reference is corrupt spins forever in HDF5 2.0), so
it never runs in the scanning process.  This module walks one file object and
returns plain data: datasets (path, dtype description, shape) and the root
attributes that name the writer.  The walk is bounded: H5Ovisit visits each
object once (a hard-link cycle ends), soft and external links are never
followed, and more objects or deeper groups than a checkpoint has stop it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

MAX_OBJECTS = 20_000  # a Keras LLM or a tf_model.h5 has a few thousand; ~60 µs each
MAX_DEPTH = 64
MAX_ATTR_BYTES = 4096

# numpy (kind, itemsize) of an HDF5 dataset -> safetensors code
NUMPY_KINDS: dict[tuple[str, int], str] = {
    ("f", 2): "F16", ("f", 4): "F32", ("f", 8): "F64",
    ("i", 1): "I8", ("i", 2): "I16", ("i", 4): "I32", ("i", 8): "I64",
    ("u", 1): "U8", ("u", 2): "U16", ("u", 4): "U32", ("u", 8): "U64",
    ("b", 1): "BOOL", ("c", 8): "C64",
}


class CallbackFile(io.RawIOBase):
    """A read-only, seekable file object whose bytes come from ``read_at(offset, size)``."""

    def __init__(self, read_at: Callable[[int, int], bytes], size: int) -> None:
        super().__init__()
        self.read_at, self.size, self.position = read_at, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise OSError("negative seek position")
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        data = self.read_at(self.position, min(len(buffer), max(0, self.size - self.position)))
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def walk(fileobj: io.RawIOBase, h5py: Any) -> dict[str, Any]:
    """{"datasets": [[name, kind, itemsize, declared, shape], ...], "attrs": {...}} or {"error": ...}."""
    found: list[list[Any]] = []
    try:
        with h5py.File(fileobj, "r") as f:
            attrs = root_attrs(f, h5py)
            count = 0

            def visit(name: str, obj: Any) -> str | None:
                nonlocal count
                count += 1
                if isinstance(name, bytes):  # h5py hands back names it cannot decode as bytes
                    return "an HDF5 object name is not UTF-8"
                if count > MAX_OBJECTS:
                    return f"more than {MAX_OBJECTS:,} HDF5 objects"
                if name.count("/") >= MAX_DEPTH:
                    return f"groups nested more than {MAX_DEPTH} deep"
                if isinstance(obj, h5py.Dataset) and obj.shape is not None:  # a null dataspace holds nothing
                    dtype = obj.dtype
                    declared = small_string_attr(obj, "dtype", h5py) if dtype.kind == "V" else None
                    found.append([name, dtype.kind if not dtype.names else "compound", dtype.itemsize,
                                  declared, [int(d) for d in obj.shape], dtype.str])
                return None

            problem = f.visititems(visit)
    except (OSError, RuntimeError, KeyError, ValueError, TypeError, OverflowError, MemoryError) as exc:
        text = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"error": f"HDF5: {text[:200]}"}
    if problem is not None:
        return {"error": problem}
    return {"datasets": found, "attrs": attrs}


def root_attrs(f: Any, h5py: Any) -> dict[str, str]:
    """Keras 2's ``layer_names`` (a tf_model.h5), counted from its dataspace alone.  Informational,
    so a broken one is left out; string values (keras_version, backend) are not read at all: a
    corrupt vlen string is what makes libhdf5 spin, and no rule needs them."""
    attrs: dict[str, str] = {}
    try:
        if "layer_names" in f.attrs:
            space = f.attrs.get_id("layer_names").shape
            attrs["layer_names"] = str(space[0] if space else 1)
    except (OSError, RuntimeError, KeyError, ValueError, TypeError):
        pass
    return attrs


def small_string_attr(obj: Any, key: str, h5py: Any) -> str | None:
    """A scalar string attribute (Keras' ``dtype="bfloat16"``), read only if it is small."""
    if key not in obj.attrs:
        return None
    attr = obj.attrs.get_id(key)
    if attr.shape not in ((), (1,)) or attr.get_storage_size() > MAX_ATTR_BYTES:
        return None
    value = obj.attrs[key]
    if hasattr(value, "shape") and value.shape == (1,):
        value = value[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value[:200] if isinstance(value, str) else None
