"""The private CPython C function the pre-commit hook's figure needs, with its pure-Python fallback.

The one module that imports CPython's private modules; the choice is made once, here, at import:
- ``tuple_field(index, doc)``: a record's field accessor (``guard.records``).  CPython's
  ``_collections._tuplegetter`` is the C descriptor ``collections.namedtuple`` uses; the fallback is the
  ``property(itemgetter(index))`` namedtuple itself falls back to.
JSON is read by json's public API (``guard.jsonload``): json's private C scanner, called here before, raised
``SystemError`` on Python 3.10 and 3.11 for a trailing comma when ``json.decoder`` was not imported (issue 46),
and bought ~2 % of the hook's instructions.

``CKPT_GUARD_PURE_PYTHON=1`` takes the fallbacks on any interpreter: tests/test_speedups.py holds both
choices to the same results on every Python the package claims.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from operator import itemgetter

__all__ = ["PURE_PYTHON", "tuple_field"]

PURE_PYTHON = os.environ.get("CKPT_GUARD_PURE_PYTHON", "") not in ("", "0")


def _property_field(index: int, doc: str) -> object:
    return property(itemgetter(index), doc=doc)


tuple_field: Callable[[int, str], object] = _property_field
if not PURE_PYTHON:
    try:
        from _collections import _tuplegetter as tuple_field  # type: ignore[no-redef]  # the C accessor replaces the fallback of the same signature
    except ImportError:  # another interpreter: the fallback above
        pass
