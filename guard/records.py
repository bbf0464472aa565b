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
    defaults = [cls.__dict__[n] for n in with_default] or None
    made = namedtuple(cls.__name__, fields, defaults=defaults, module=cls.__module__)  # type: ignore[misc]
    # the body goes onto the namedtuple itself, not onto a subclass of it: one class per record instead
    # of two (a hook imports ~25 records before its first read; each second class cost as much as the
    # namedtuple), and one level less for every attribute lookup on a record
    for key, value in cls.__dict__.items():
        if key not in _SKIP and key not in fields and key != "__doc__":
            setattr(made, key, value)
    made.__doc__ = cls.__doc__ or made.__doc__
    made.__qualname__ = cls.__qualname__
    made.__annotations__ = cls.__dict__.get("__annotations__", {})
    return made
