"""Legacy torch files as torch 0.4 wrote them in 2018, for the tests (not a test module).

torch 1.6+ still writes the legacy layout (``_use_new_zipfile_serialization=False``),
but no longer the way 0.4 did.  This writes it as torch 0.4's ``torch/serialization.py``
``_save`` did, through the stdlib's own protocol-2 pickler:

- five pickles: ``MAGIC_NUMBER``, ``PROTOCOL_VERSION`` (1001), ``sys_info`` (with the
  writer's ``type_sizes``: ``long`` is 4 on Windows), the object, the sorted storage keys;
  then per key an int64 element count and the raw little-endian bytes;
- a storage is the persistent id ``('storage', torch.FloatStorage, root_key, location,
  root.size(), view_metadata)``: six elements, ``view_metadata`` None or
  ``(view_key, offset, view_size)``; locations such as ``'cuda:0'``;
- a tensor is ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
  requires_grad, backward_hooks)``;
- ``python2=True``: what cPickle under Python 2 wrote: ``str`` keys as SHORT_BINSTRING,
  ``long`` sizes as LONG1, and ``OrderedDict`` reduced to ``(OrderedDict, ([[k, v], ...],))``
  (Python 2's ``OrderedDict.__reduce__``, its pairs as lists);
- ``torch.save(model)``: each ``nn.Module`` class the first time as the persistent id
  ``('module', class, source_file, source)``.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
ITEMSIZE = {"Float": 4, "Double": 8, "Half": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1}
LINUX_SIZES = {"short": 2, "int": 4, "long": 8}
WINDOWS_SIZES = {"short": 2, "int": 4, "long": 4}


class Py2Str(bytes):
    """A Python 2 ``str``."""


class Py2Long(int):
    """A Python 2 ``long``."""


@dataclass(frozen=True)
class Global:
    """A class or function, pickled by name (GLOBAL), never imported here."""

    module: str
    name: str

    def __call__(self, *args: object) -> None:  # pickle asks that a reduce function be callable
        raise TypeError("a stand-in")


@dataclass(frozen=True)
class ModuleClass(Global):
    """An nn.Module subclass."""


@dataclass(eq=False)
class Storage:
    kind: str  # "Float", "Long", ...
    data: bytes
    location: str = "cpu"
    key: str = ""  # str(root._cdata): a pointer, as decimal digits
    root: Storage | None = None  # a view: its root, offset and size in elements
    offset: int = 0
    size: int = 0

    @property
    def numel(self) -> int:
        return len(self.data) // ITEMSIZE[self.kind]


@dataclass(eq=False)
class Tensor:
    storage: Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool = False


@dataclass(eq=False)
class Module:
    """An nn.Module instance pickled by ``torch.save(model)``: its class and its ``__dict__``."""

    cls: ModuleClass
    state: dict[str, Any] = field(default_factory=dict)


def tensor(kind: str, values: bytes, size: tuple[int, ...], *, location: str = "cpu", key: str) -> Tensor:
    """A contiguous tensor on a storage of its own."""
    return Tensor(Storage(kind, values, location, key), 0, size, contiguous(size))


def contiguous(size: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_prod(size[i + 1:]) for i in range(len(size)))


def _prod(dims: tuple[int, ...]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def view(root: Storage, *, key: str, offset: int, size: int) -> Storage:
    return Storage(root.kind, b"", root.location, key, root, offset, size)


class _Pickler(pickle._Pickler):  # type: ignore[misc]  # the pure-Python pickler: its dispatch is a dict
    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, out: io.BytesIO, *, python2: bool, storages: dict[str, Storage]) -> None:
        super().__init__(out, protocol=2)
        self.python2 = python2
        self.storages = storages
        self.modules_seen: set[Global] = set()

    def _s(self, text: str) -> object:
        return Py2Str(text.encode("latin-1")) if self.python2 else text

    def _n(self, number: int) -> object:
        return Py2Long(number) if self.python2 else number

    def persistent_id(self, obj: object) -> object:
        if isinstance(obj, Storage):
            root = obj.root or obj
            self.storages[root.key] = root
            view_metadata = (self._s(obj.key), self._n(obj.offset), self._n(obj.size)) if obj.root else None
            return (self._s("storage"), Global("torch", f"{root.kind}Storage"), self._s(root.key),
                    self._s(root.location), self._n(root.numel), view_metadata)
        if isinstance(obj, ModuleClass) and obj not in self.modules_seen:
            self.modules_seen.add(obj)  # 0.4 saved each nn.Module class with its source, the first time
            return (self._s("module"), obj, self._s(f"/home/user/{obj.module}.py"), self._s("class X: ..."))
        return None

    def save_global_stand_in(self, obj: Global, name: object = None) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    def save_py2str(self, obj: Py2Str) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + bytes(obj))
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + bytes(obj))
        self.memoize(obj)

    def save_py2long(self, obj: Py2Long) -> None:
        encoded = pickle.encode_long(int(obj))
        self.write(pickle.LONG1 + bytes([len(encoded)]) + encoded)

    def save_tensor(self, obj: Tensor) -> None:
        args = (obj.storage, obj.offset, obj.size, obj.stride, obj.requires_grad, None)
        self.save_reduce(Global("torch._utils", "_rebuild_tensor_v2"), args, obj=obj)

    def save_module(self, obj: Module) -> None:
        # protocol 2: copyreg.__reduce_ex__ -> cls.__new__ through NEWOBJ, then the __dict__ by BUILD
        self.save(obj.cls)
        self.save(())
        self.write(pickle.NEWOBJ)
        self.memoize(obj)
        self.save(self._convert(obj.state))
        self.write(pickle.BUILD)

    def save_ordered(self, obj: OrderedDict) -> None:
        if not self.python2:  # Python 3's OrderedDict.__reduce__
            return self.save_reduce(OrderedDict, (), dict(vars(obj)) or None, None, iter(obj.items()), obj=obj)
        pairs = [[k, v] for k, v in obj.items()]
        state = getattr(obj, "_metadata_state", None)
        self.save_reduce(Global("collections", "OrderedDict"), (pairs,), state, obj=obj)
        return None

    def _convert(self, value: object) -> object:
        """Python 3 values the way Python 2 held them: str keys, nested containers."""
        if isinstance(value, OrderedDict):
            out: OrderedDict = OrderedDict((self._s(k) if isinstance(k, str) else k, self._convert(v))
                                           for k, v in value.items())
            if hasattr(value, "_metadata"):  # 0.4.1's state_dict versions, the OrderedDict's instance dict
                metadata = self._convert(value._metadata)
                if self.python2:
                    out._metadata_state = {self._s("_metadata"): metadata}  # type: ignore[attr-defined]
                else:
                    out._metadata = metadata  # type: ignore[attr-defined]
            return out
        if isinstance(value, dict):
            return {self._s(k) if isinstance(k, str) else k: self._convert(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._convert(v) for v in value]
        if isinstance(value, str):
            return self._s(value)
        return value  # tensors, modules (converted as they are saved), numbers

    dispatch[Global] = save_global_stand_in
    dispatch[ModuleClass] = save_global_stand_in
    dispatch[Py2Str] = save_py2str
    dispatch[Py2Long] = save_py2long
    dispatch[Tensor] = save_tensor
    dispatch[Module] = save_module
    dispatch[OrderedDict] = save_ordered


def save_legacy(obj: object, *, python2: bool = False, type_sizes: dict[str, int] | None = None,
                object_pickle: bytes | None = None) -> bytes:
    """The bytes ``torch.save(obj, f)`` wrote under torch 0.4 (``pickle_protocol=2``, its default).

    ``object_pickle``: hand-made bytes in place of the object's pickle (hostile cases).
    """
    out = io.BytesIO()
    storages: dict[str, Storage] = {}
    sizes = type_sizes or LINUX_SIZES
    for value in (MAGIC_NUMBER, PROTOCOL_VERSION):  # a long and an int under Python 2 as well
        _Pickler(out, python2=python2, storages=storages).dump(value)
    header = _Pickler(out, python2=python2, storages=storages)
    header.dump(header._convert({"protocol_version": PROTOCOL_VERSION, "little_endian": True, "type_sizes": sizes}))
    main = _Pickler(out, python2=python2, storages=storages)
    if object_pickle is None:
        main.dump(main._convert(obj))
    else:
        out.write(object_pickle)
    keys = sorted(storages)
    tail = _Pickler(out, python2=python2, storages=storages)
    tail.dump([tail._s(k) for k in keys])
    for key in keys:
        root = storages[key]
        out.write(struct.pack("<q", root.numel) + root.data)
    return out.getvalue()


# ------------------------------------------------------------------ samples

def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def state_dict_04(location: str, *, half: bool = True) -> OrderedDict:
    """A 0.4.1 state dict: tied weights, a storage view, an int64 counter, ``_metadata``."""
    weight = tensor("Float", f32(*range(12)), (3, 4), location=location, key="94010000000016")
    root = Storage("Float", f32(*range(10)), location, "94010000000048")
    state = OrderedDict([
        ("fc.weight", weight),
        ("fc.bias", tensor("Float", f32(1, 2, 3), (3,), location=location, key="94010000000032")),
        ("emb.weight", Tensor(view(root, key="94010000000064", offset=2, size=6), 1, (2, 2), (2, 1))),
        ("emb.scale", Tensor(view(root, key="94010000000080", offset=8, size=2), 0, (2,), (1,))),
        ("half", tensor("Half", struct.pack("<4e", 1, 2, 3, 4), (2, 2), location=location, key="94010000000096")),
        ("bn.num_batches_tracked", tensor("Long", struct.pack("<q", 7), (), location=location, key="94010000000112")),
        ("head.weight", weight),
    ])
    state._metadata = OrderedDict([("", {"version": 1}), ("fc", {"version": 1})])  # type: ignore[attr-defined]
    if not half:
        del state["half"]
    return state


def legacy_samples() -> list[bytes]:
    """0.4-era files for the differential and the fuzz seeds: Python 2 on cuda:0, Python 3 from Windows."""
    return [save_legacy(state_dict_04("cuda:0"), python2=True),
            save_legacy(state_dict_04("cpu", half=False), type_sizes=WINDOWS_SIZES)]
