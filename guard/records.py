"""Immutable records without ``typing``: ``class Point(Record): x: int; y: int = 0`` is a NamedTuple.

The package's one record type.  To a type checker ``Record`` is ``typing.NamedTuple`` (the class
statement means the same: fields with their types and defaults, then methods, properties and
classmethods).  At run time it builds what namedtuple builds without importing typing (about a quarter
of a hook's start-up, docs/benchmarks.md) and with one shared ``__new__`` (``collections.namedtuple``
compiles one per class with ``eval``: ~0.1 ms each, and a hook imports 26 records before its first read):
a tuple subclass with ``__slots__ = ()``, a field accessor per field, ``_fields``, ``_field_defaults``,
``_make``, ``_replace``, ``_asdict``, namedtuple's ``repr`` and pickling.  Methods must not use
zero-argument ``super()`` (the class they close over is not the record).  A ``@dataclass`` is left only
to mutable state, and to the torch pickle's descriptions, which must not be tuples
(tests/test_architecture.py holds the rule).
"""

from __future__ import annotations

from guard._speedups import tuple_field  # namedtuple's own field accessor (a C descriptor), or its fallback

_SKIP = {"__dict__", "__weakref__", "__annotations__", "__qualname__", "__module__", "__doc__"}
_tuple_new = tuple.__new__  # the one constructor every record shares (namedtuple compiles one per class)
_MISSING = object()  # a field with no default, not given: compared by identity only


def _build(name: str, body: dict[str, Any]) -> type:
    """The record class of a class statement's body (its namespace: any value under any name)."""
    annotations: dict[str, object] = body.get("__annotations__", {})
    fields = tuple(annotations)
    with_default = [field for field in fields if field in body]
    if fields[len(fields) - len(with_default):] != tuple(with_default):
        raise TypeError(f"{name}: fields with defaults must come after those without")
    namespace: dict[str, object] = {
        "__slots__": (), "__doc__": body.get("__doc__") or f"{name}({', '.join(fields)})",
        "__module__": body["__module__"], "__qualname__": body.get("__qualname__", name),
        "__annotations__": annotations,
        "_fields": fields, "_field_defaults": {field: body[field] for field in with_default},
        "_padding": tuple(body.get(field, _MISSING) for field in fields),  # each field's default
        "_required": len(fields) - len(with_default),
        "__match_args__": fields, "__new__": _new, "_make": classmethod(_make), "_replace": _replace,
        "_asdict": _asdict, "__repr__": _repr, "__getnewargs__": _getnewargs,
    }
    for index, field in enumerate(fields):
        namespace[field] = tuple_field(index, f"Alias for field number {index}")
    for key, value in body.items():  # the body: methods, properties, constants
        if key not in _SKIP and key not in fields:
            namespace[key] = value
    return type(name, (tuple,), namespace)


class _RecordMeta(type):
    """``class X(Record)`` builds the record of its body, as typing.NamedTuple's metaclass builds a namedtuple."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, object]) -> type:
        if not bases:  # Record itself
            return super().__new__(mcls, name, bases, namespace)
        return _build(name, namespace)


TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (the hook's path)
if TYPE_CHECKING:
    from typing import Any, NamedTuple as Record
else:
    class Record(metaclass=_RecordMeta):
        """The base of every record: ``class Finding(Record): code: str; ...``."""


def _new(cls, *args, **kwargs):
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


def _make(cls, iterable):
    made = _tuple_new(cls, iterable)
    if len(made) != len(cls._fields):
        raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(made)}")
    return made


def _replace(self, /, **kwargs):
    made = self._make(map(kwargs.pop, self._fields, self))
    if kwargs:
        raise ValueError(f"Got unexpected field names: {list(kwargs)!r}")
    return made


def _asdict(self):
    return dict(zip(self._fields, self))


def _repr(self):
    return f"{type(self).__name__}({', '.join(f'{name}={value!r}' for name, value in zip(self._fields, self))})"


def _getnewargs(self):
    return tuple(self)
