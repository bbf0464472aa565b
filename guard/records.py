"""Immutable records without ``typing``: a class body of annotated fields becomes a tuple subclass.

``typing.NamedTuple`` imports typing (about a quarter of a hook's start-up) and compiles every
deferred annotation into a ForwardRef; ``collections.namedtuple`` compiles a ``__new__`` per class
with ``eval`` (about 0.1 ms each: a hook imports 26 records before its first read).  ``@record``
keeps the annotated-class syntax (fields with their types and defaults, then methods, properties
and classmethods) and builds what namedtuple builds, with one shared ``__new__``: a tuple subclass
with ``__slots__ = ()``, a property per field, ``_fields``, ``_field_defaults``, ``_make``,
``_replace``, ``_asdict``, namedtuple's ``repr`` and pickling.  Methods must not use zero-argument
``super()`` (the class they close over is the one the decorator replaces).
"""

from __future__ import annotations

from guard._speedups import tuple_field  # namedtuple's own field accessor (a C descriptor), or its fallback

_SKIP = {"__dict__", "__weakref__", "__annotations__", "__qualname__", "__module__"}
_tuple_new = tuple.__new__  # the one constructor every record shares (namedtuple compiles one per class)
_MISSING = object()  # a field with no default, not given: compared by identity only


def record(cls: type) -> type:
    fields = tuple(cls.__dict__.get("__annotations__", {}))
    with_default = [name for name in fields if name in cls.__dict__]
    if fields[len(fields) - len(with_default):] != tuple(with_default):
        raise TypeError(f"{cls.__name__}: fields with defaults must come after those without")
    namespace: dict[str, object] = {
        "__slots__": (), "__doc__": cls.__doc__ or f"{cls.__name__}({', '.join(fields)})",
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "__annotations__": cls.__dict__.get("__annotations__", {}),
        "_fields": fields, "_field_defaults": {name: cls.__dict__[name] for name in with_default},
        "_padding": tuple(cls.__dict__.get(name, _MISSING) for name in fields),  # each field's default
        "_required": len(fields) - len(with_default),
        "__match_args__": fields, "__new__": _new, "_make": classmethod(_make), "_replace": _replace,
        "_asdict": _asdict, "__repr__": _repr, "__getnewargs__": _getnewargs,
    }
    for index, name in enumerate(fields):
        namespace[name] = tuple_field(index, f"Alias for field number {index}")
    for key, value in cls.__dict__.items():  # the body: methods, properties, constants
        if key not in _SKIP and key not in fields and key != "__doc__":
            namespace[key] = value
    return type(cls.__name__, (tuple,), namespace)


def _new(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
    fields = cls._fields
    count = len(args)
    if count > len(fields):
        raise TypeError(f"{cls.__name__}() takes {len(fields)} arguments but {count} were given")
    if not kwargs:
        if count == len(fields):
            return _tuple_new(cls, args)
        values = args + cls._padding[count:]
    else:  # the rest by name, else by default: each ``kwargs.pop(field, default)`` runs in C
        values = args + tuple(map(kwargs.pop, fields[count:], cls._padding[count:]))
        if kwargs:
            name = next(iter(kwargs))
            problem = "multiple values for argument" if name in fields else "an unexpected keyword argument"
            raise TypeError(f"{cls.__name__}() got {problem} {name!r}")
    if count < cls._required and _MISSING in values[count:cls._required]:
        missing = fields[values.index(_MISSING)]
        raise TypeError(f"{cls.__name__}() missing required argument: {missing!r}")
    return _tuple_new(cls, values)


def _make(cls, iterable):  # type: ignore[no-untyped-def]
    made = _tuple_new(cls, iterable)
    if len(made) != len(cls._fields):
        raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(made)}")
    return made


def _replace(self, /, **kwargs):  # type: ignore[no-untyped-def]
    made = self._make(map(kwargs.pop, self._fields, self))
    if kwargs:
        raise ValueError(f"Got unexpected field names: {list(kwargs)!r}")
    return made


def _asdict(self):  # type: ignore[no-untyped-def]
    return dict(zip(self._fields, self))


def _repr(self):  # type: ignore[no-untyped-def]
    return f"{type(self).__name__}({', '.join(f'{name}={value!r}' for name, value in zip(self._fields, self))})"


def _getnewargs(self):  # type: ignore[no-untyped-def]
    return tuple(self)
