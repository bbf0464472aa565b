"""The one allow-list walker for trainers' pickles: a row's ``PickleGlobals``, never an import or a call.

``guard.readers.torch.pickle.PickleWalker`` moves descriptions (tensors, containers, globals) with torch's
weights-only allow-list.  A trainer's pickle also holds a few of the trainer's own classes, each a record of
plain values (DeepSpeed's loss scaler, DCP's metadata dataclasses, Megatron's ``argparse.Namespace``): the
row names them, and here each call of one becomes an ``InertRecord`` holding what the pickle gave it.  Every
other global is recorded by name in ``unsafe`` (CG003), and nothing it would build is used.
"""

from __future__ import annotations

from collections.abc import Callable

from guard.errors import MalformedCheckpoint
from guard.readers.torch.pickle import ITEMSIZES, DictDesc, Global, PickleWalker, Subclass, Unsafe
from guard.readers.torch.tensors import storage_from_pid
from guard.training.registry import PickleGlobals

_TORCH_DTYPES = frozenset(f"torch.{name}" for name in ITEMSIZES)


class InertRecord:
    """An allow-listed class's object: its class's name, the call's arguments and BUILD's state; never built."""

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


class AllowListWalker(PickleWalker):
    """The shared walker with a trainer's globals: on torch's weights-only list, or on torch's dtypes alone."""

    def __init__(self, allowed: PickleGlobals, *,
                 persistent_load: Callable[[object], object] = storage_from_pid) -> None:
        super().__init__(persistent_load)
        self.allowed = allowed
        self.accepts = {dotted: (tuple((value,) for value in values), what)
                        for dotted, values, what in allowed.accepts}

    def _global(self, module: str, name: str) -> Global | Subclass | Unsafe:
        dotted = f"{module}.{name}"
        if dotted in self.allowed.records or dotted in self.allowed.values:
            return Global(module, name)
        if self.allowed.base == "weights-only":
            return super()._global(module, name)
        if dotted in _TORCH_DTYPES:
            return Global(module, name)
        self.unsafe.setdefault(dotted)
        return Unsafe(dotted)

    def _call(self, func: object, args: object) -> object:
        if isinstance(func, Global) and func.dotted in self.accepts:
            accepted, what = self.accepts[func.dotted]
            called = tuple(args) if isinstance(args, (tuple, list)) else args
            if not isinstance(called, tuple) or called[:1] not in accepted:
                # the class refuses any other value (an Enum's lookup, torch's layout cache): so do we
                raise MalformedCheckpoint(f"{func.name}{called!r} is not {what}")
        if isinstance(func, Global) and func.dotted in self.allowed.records:
            return InertRecord(func.dotted, tuple(args) if isinstance(args, (tuple, list)) else ())
        return super()._call(func, args)

    def _build(self, target: object, state: object) -> None:
        if isinstance(target, InertRecord):
            target.state = state
        else:
            super()._build(target, state)
