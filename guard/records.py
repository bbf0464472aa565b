"""Immutable records without ``typing``: a class body of annotated fields becomes a namedtuple.

``typing.NamedTuple`` imports typing (about a quarter of a hook's start-up) and compiles every
deferred annotation into a ForwardRef; ``collections.namedtuple`` does neither.  ``@record``
keeps the annotated-class syntax: fields with their types and defaults, then methods,
properties and classmethods.  The result is a tuple subclass with ``__slots__ = ()``,
``_replace`` and ``_asdict``, as a NamedTuple is.  Methods must not use zero-argument
``super()`` (the class they close over is the one the decorator replaces).
"""

from __future__ import annotations

from collections import namedtuple

_SKIP = {"__dict__", "__weakref__", "__annotations__", "__qualname__", "__module__"}


def record(cls: type) -> type:
    fields = list(cls.__dict__.get("__annotations__", {}))
    with_default = [name for name in fields if name in cls.__dict__]
    if fields[len(fields) - len(with_default):] != with_default:
        raise TypeError(f"{cls.__name__}: fields with defaults must come after those without")
    base = namedtuple(cls.__name__, fields, defaults=[cls.__dict__[n] for n in with_default] or None,  # type: ignore[misc]
                      module=cls.__module__)
    body = {k: v for k, v in cls.__dict__.items() if k not in _SKIP and k not in fields}
    body.update(__slots__=(), __doc__=cls.__doc__ or base.__doc__, __qualname__=cls.__qualname__,
                __annotations__=cls.__dict__.get("__annotations__", {}), __module__=cls.__module__)
    return type(cls.__name__, (base,), body)
