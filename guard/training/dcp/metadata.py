"""A DCP ``.metadata`` pickle, read by an allow-list that builds inert records and never imports or calls.

torch writes ``.metadata`` with ``pickle.dump`` and reads it with plain ``pickle.load``
(pytorch/pytorch#189308): an untrusted checkpoint can run code there.  Here the shared static walker
(``guard.readers.torch.pickle.PickleWalker``) moves descriptions, with this module's allow-list: the
``torch.distributed.checkpoint`` metadata classes, ``torch.Size``, the torch dtypes, the layout and
memory-format helpers, ``pathlib``'s paths, the older ``TensorProperties`` and the planner records
Megatron keeps (``all_local_plans``).  Each becomes an ``Instance`` holding what the pickle gave it;
every other global is recorded by name (CG003) and nothing it would build is used.
"""

from __future__ import annotations

import io
import pickle

from guard.errors import MalformedCheckpoint
from guard.readers.torch.pickle import MAX_PICKLE_BYTES, DictDesc, Global, PickleWalker, Unsafe

_DCP = "torch.distributed.checkpoint"
# Classes whose instances are plain records (dataclasses, a NamedTuple, an enum): built here as Instances.
RECORD_CLASSES: frozenset[str] = frozenset({
    *(f"{_DCP}.metadata.{name}" for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")),
    f"{_DCP}.filesystem._StorageInfo",
    f"{_DCP}._extension.ExtensionTransformEntry",
    "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",  # older torch
    "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
    *(f"{_DCP}.planner.{name}" for name in (  # Megatron 0.16 keeps its plans in the metadata
        "SavePlan", "WriteItem", "TensorWriteData", "WriteItemType", "BytesIOWriteData")),
    "megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata",  # older Megatron
    "megatron.core.dist_checkpointing.strategies.torch.MCoreSavePlan",
})
# Globals that only name a value the records hold: described, never called.
VALUE_GLOBALS: frozenset[str] = frozenset({
    "torch.Size", "torch.serialization._get_layout", "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.PurePosixPath",
    "collections.OrderedDict", "builtins.set", "builtins.frozenset",
})


# str() of each torch.layout (torch.serialization._get_layout's table in torch 2.13)
TORCH_LAYOUTS: frozenset[str] = frozenset({"torch.strided", "torch.sparse_coo", "torch.sparse_csr",
                                           "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc",
                                           "torch._mkldnn", "torch.jagged"})
MEM_FORMAT_CLASSES = frozenset({"_MEM_FORMAT_ENCODING", "MEM_FORMAT_ENCODING"})


class Instance:
    """An allowlisted class's object: its class name, the call's arguments and BUILD's state."""

    __slots__ = ("cls", "args", "state")

    def __init__(self, cls: str, args: tuple[object, ...]) -> None:
        self.cls = cls
        self.args = args
        self.state: object = None

    @property
    def name(self) -> str:
        return self.cls.rpartition(".")[2]

    def field(self, key: str, default: object = None) -> object:
        """A dataclass field from BUILD's state (a dict, or ``(dict, slots)`` for slotted classes)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:
            for part in state:
                if isinstance(part, DictDesc):
                    value = _lookup(part, key)
                    if value is not _MISSING:
                        return value
            return default
        if isinstance(state, DictDesc):
            value = _lookup(state, key)
            return default if value is _MISSING else value
        return default


_MISSING = object()


def _lookup(desc: DictDesc, key: str) -> object:
    for k, v in desc.items:
        if k == key:
            return v
    return _MISSING


class MetadataWalker(PickleWalker):
    """The shared walker with the DCP allow-list in place of torch's weights-only one."""

    def __init__(self) -> None:
        super().__init__(_no_persistent_ids)

    def _global(self, module: str, name: str) -> Global | Unsafe:  # type: ignore[override]
        dotted = f"{module}.{name}"
        if dotted in RECORD_CLASSES or dotted in VALUE_GLOBALS or (module == "torch" and _is_dtype(name)):
            return Global(module, name)
        self.unsafe.setdefault(dotted)
        return Unsafe(dotted)

    def _call(self, func: object, args: object) -> object:
        if isinstance(func, Global) and func.dotted in RECORD_CLASSES:
            called = tuple(args) if isinstance(args, (tuple, list)) else ()
            if func.name in MEM_FORMAT_CLASSES and called[:1] not in ((0,), (1,), (2,)):
                # torch's Enum refuses any other value (contiguous, channels_last, preserve): so do we
                raise MalformedCheckpoint(f"{func.name}{called!r} is not a memory format torch encodes")
            return Instance(func.dotted, called)
        if isinstance(func, Global) and func.dotted == "torch.serialization._get_layout" and (
                not isinstance(args, (tuple, list)) or tuple(args)[:1] not in [(n,) for n in TORCH_LAYOUTS]):
            raise MalformedCheckpoint(f"_get_layout{tuple(args) if isinstance(args, (tuple, list)) else args!r} "
                                      "names no torch layout")  # torch's cache lookup raises KeyError
        return super()._call(func, args)

    def _build(self, target: object, state: object) -> None:
        if isinstance(target, Instance):
            target.state = state
        else:
            super()._build(target, state)


def _no_persistent_ids(pid: object) -> object:
    raise MalformedCheckpoint("a DCP .metadata pickle holds no persistent ids; this one does")


def _is_dtype(name: str) -> bool:
    from guard.readers.torch.pickle import ITEMSIZES

    return name in ITEMSIZES


def walk_metadata(data: bytes) -> tuple[object, tuple[str, ...]]:
    """The pickle's description and the globals it names outside the allow-list (in order)."""
    if len(data) > MAX_PICKLE_BYTES:
        raise MalformedCheckpoint(f".metadata is {len(data):,} bytes, past the {MAX_PICKLE_BYTES:,} read")
    if data[:1] == b"\x80" and len(data) > 1 and data[1] > pickle.HIGHEST_PROTOCOL:
        raise MalformedCheckpoint(f".metadata declares pickle protocol {data[1]}; pickle.load reads up to "
                                  f"{pickle.HIGHEST_PROTOCOL}")
    walker = MetadataWalker()
    stream = io.BytesIO(data)
    root = walker.walk(stream)
    return root, tuple(walker.unsafe)
