"""A DCP checkpoint's metadata as plain records: its items, their chunks and where each chunk's bytes are.

``parse_metadata`` turns the walker's description of ``Metadata`` (``guard.training.dcp.metadata``) into
``DcpMetadata``; a structure torch would not have written is a ``MalformedCheckpoint`` (CG001).
"""

from __future__ import annotations

from guard import dtypes
from guard.errors import MalformedCheckpoint
from guard.readers.torch.pickle import DictDesc, Global, Unsafe
from guard.records import Record
from guard.training.dcp.metadata import MEM_FORMAT_CLASSES, walk_metadata
from guard.training.pickles import InertRecord

_MAX_DIMS = 64


class DcpChunk(Record):
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


class DcpItem(Record):
    """One entry of ``state_dict_metadata``: a tensor (dtype, global shape, chunks) or a BYTE_IO item."""

    fqn: str
    path: tuple[str, ...]  # planner_data: the path through the nested state dict (empty where not saved)
    dtype: str | None  # a safetensors code (an unknown torch dtype keeps its name); None for BYTE_IO
    shape: tuple[int, ...] | None
    chunks: tuple[DcpChunk, ...] = ()


class DcpStorage(Record):
    """One ``storage_data`` entry: the bytes of one chunk (or BYTE_IO item), in which file."""

    fqn: str
    offset: tuple[int, ...] | None  # the chunk's offsets; None for BYTE_IO
    file: str  # relative_path
    start: int
    length: int
    transforms: tuple[str, ...] = ()


class DcpMetadata(Record):
    items: tuple[DcpItem, ...]
    storage: tuple[DcpStorage, ...]
    version: str | None
    unsafe: tuple[str, ...]  # globals outside the allow-list (CG003): when any, nothing else is trusted


def parse_metadata(data: bytes) -> DcpMetadata:
    root, unsafe = walk_metadata(data)
    if unsafe:
        return DcpMetadata((), (), None, unsafe)
    if not isinstance(root, InertRecord) or root.name not in ("Metadata", "MCoreMetadata"):
        raise MalformedCheckpoint(f"the pickle holds {_kind(root)}, not torch.distributed.checkpoint's Metadata")
    planner = _pairs(root.field("planner_data"), "planner_data", optional=True)
    paths = {str(k): tuple(str(p) for p in v) for k, v in planner if isinstance(v, (tuple, list))}
    items = tuple(_item(key, value, paths) for key, value in _pairs(root.field("state_dict_metadata"),
                                                                      "state_dict_metadata"))
    storage = tuple(_storage(key, value) for key, value in _pairs(root.field("storage_data"), "storage_data"))
    version = root.field("version")
    return DcpMetadata(items, storage, version if isinstance(version, str) else None, ())


def _kind(value: object) -> str:
    return value.cls if isinstance(value, InertRecord) else type(value).__name__


def _pairs(value: object, what: str, *, optional: bool = False) -> list[tuple[object, object]]:
    if value is None and optional:
        return []
    if not isinstance(value, DictDesc):
        raise MalformedCheckpoint(f"Metadata.{what} is {_kind(value)}, not a dict")
    return value.items


def _item(key: object, value: object, paths: dict[str, tuple[str, ...]]) -> DcpItem:
    if not isinstance(key, str):
        raise MalformedCheckpoint(f"state_dict_metadata key is {_kind(key)}, not a string")
    path = paths.get(key, ())
    if isinstance(value, InertRecord) and value.name == "BytesStorageMetadata":
        return DcpItem(key, path, None, None)
    if not isinstance(value, InertRecord) or value.name != "TensorStorageMetadata":
        raise MalformedCheckpoint(f"{key!r}: metadata is {_kind(value)}, not TensorStorageMetadata")
    shape = _ints(value.field("size"), f"{key!r} size")
    chunks = value.field("chunks")
    if not isinstance(chunks, list):
        raise MalformedCheckpoint(f"{key!r}: chunks is {_kind(chunks)}, not a list")
    return DcpItem(key, path, _dtype(value.field("properties"), key), shape, tuple(_chunk(c, key) for c in chunks))


def _dtype(properties: object, key: str) -> str:
    if not isinstance(properties, InertRecord):
        raise MalformedCheckpoint(f"{key!r}: properties is {_kind(properties)}, not TensorProperties")
    dtype = properties.field("dtype")
    if isinstance(properties.state, tuple) and properties.name == "TensorProperties" and not any(
            isinstance(part, DictDesc) for part in properties.state):
        # TensorProperties.__getstate__: (dtype, layout, requires_grad, memory format, pin_memory), unpacked
        # as five by its __setstate__, which refuses a memory format that is not its enum
        state = properties.state
        if len(state) != 5 or not (isinstance(state[3], InertRecord) and state[3].name in MEM_FORMAT_CLASSES):
            raise MalformedCheckpoint(f"{key!r}: TensorProperties' state is not (dtype, layout, requires_grad, "
                                      "memory format, pin_memory)")
    if dtype is None and isinstance(properties.state, tuple) and properties.state:
        dtype = properties.state[0]  # TensorProperties.__getstate__: (dtype, layout, requires_grad, ...)
    if dtype is None and properties.args:
        dtype = properties.args[0]
    if not isinstance(dtype, Global) or dtype.module != "torch":
        raise MalformedCheckpoint(f"{key!r}: dtype is {_kind(dtype)}, not a torch dtype")
    return dtypes.TORCH_NAMES.get(dtype.name, dtype.name)


def _chunk(chunk: object, key: str) -> DcpChunk:
    if not isinstance(chunk, InertRecord) or chunk.name != "ChunkStorageMetadata":
        raise MalformedCheckpoint(f"{key!r}: a chunk is {_kind(chunk)}, not ChunkStorageMetadata")
    offsets, sizes = _ints(chunk.field("offsets"), f"{key!r} chunk offsets"), _ints(chunk.field("sizes"),
                                                                                 f"{key!r} chunk sizes")
    if len(offsets) != len(sizes):
        raise MalformedCheckpoint(f"{key!r}: a chunk's offsets and sizes differ in length")
    return DcpChunk(offsets, sizes)


def _storage(key: object, value: object) -> DcpStorage:
    if not isinstance(key, InertRecord) or key.name != "MetadataIndex":
        raise MalformedCheckpoint(f"storage_data key is {_kind(key)}, not MetadataIndex")
    fqn = key.field("fqn")
    if not isinstance(fqn, str):
        raise MalformedCheckpoint("a MetadataIndex has no fqn")
    offset = key.field("offset")
    offsets = None if offset is None else _ints(offset, f"{fqn!r} storage offset")
    if not isinstance(value, InertRecord) or value.name != "_StorageInfo":
        raise MalformedCheckpoint(f"{fqn!r}: storage is {_kind(value)}, not _StorageInfo")
    relative, start, length = value.field("relative_path"), value.field("offset"), value.field("length")
    if not isinstance(relative, str) or type(start) is not int or type(length) is not int or start < 0 or length < 0:
        raise MalformedCheckpoint(f"{fqn!r}: its _StorageInfo is not a path and two non-negative integers")
    if "/" in relative or "\\" in relative or relative in ("", ".", ".."):
        raise MalformedCheckpoint(f"{fqn!r}: storage file {relative!r} is not a name in the checkpoint's folder")
    transforms = value.field("transform_descriptors") or ()
    return DcpStorage(fqn, offsets, relative, start, length,
                      tuple(str(t) for t in transforms) if isinstance(transforms, (list, tuple)) else ())


def _ints(value: object, what: str) -> tuple[int, ...]:
    if isinstance(value, Unsafe) or not isinstance(value, (tuple, list)) or len(value) > _MAX_DIMS:
        raise MalformedCheckpoint(f"{what} is not a tuple of integers")
    if not all(type(v) is int and v >= 0 for v in value):
        raise MalformedCheckpoint(f"{what} holds a negative or non-integer value")
    return tuple(value)
