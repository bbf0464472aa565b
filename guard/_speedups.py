"""The private CPython C functions the pre-commit hook's figure needs, each with a pure-Python fallback.

The one module that imports CPython's private modules; the choice is made once, here, at import:
- ``tuple_field(index, doc)``: a record's field accessor (``guard.records``).  CPython's
  ``_collections._tuplegetter`` is the C descriptor ``collections.namedtuple`` uses; the fallback is the
  ``property(itemgetter(index))`` namedtuple itself falls back to.
- ``make_scanner(context)``, ``quote_ascii(text)``: json's own C scanner and string encoder (``_json``), which
  ``guard.jsonload`` calls so that a hook never imports json (its six regular expressions compiled in pure
  Python: 2-4 % of the hook's call, docs/benchmarks.md); the fallbacks are json's own pure-Python ones.

``CKPT_GUARD_PURE_PYTHON=1`` takes the fallbacks on any interpreter: tests/test_speedups.py holds both
choices to the same results on every Python the package claims.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from operator import itemgetter

__all__ = ["PURE_PYTHON", "make_scanner", "quote_ascii", "tuple_field"]

PURE_PYTHON = os.environ.get("CKPT_GUARD_PURE_PYTHON", "") not in ("", "0")


def _property_field(index: int, doc: str) -> object:
    return property(itemgetter(index), doc=doc)


def _py_make_scanner(context: object) -> Callable[[str, int], tuple[object, int]]:
    """json's pure-Python scanner with the settings ``context`` holds (those a JSONDecoder holds)."""
    from json import decoder, scanner

    given = vars(context)  # the settings a JSONDecoder holds, as guard.jsonload.scanner passes them
    settings = decoder.JSONDecoder(
        object_hook=given["object_hook"], object_pairs_hook=given["object_pairs_hook"],
        parse_float=given["parse_float"], parse_int=given["parse_int"], parse_constant=given["parse_constant"],
        strict=given["strict"])
    settings.parse_string = decoder.py_scanstring  # type: ignore[attr-defined]  # the pure-Python scanner's hook and function, which typeshed leaves out
    scan: Callable[[str, int], tuple[object, int]] = scanner.py_make_scanner(settings)  # type: ignore[attr-defined]  # json.scanner's pure-Python make_scanner, not in typeshed
    return scan


def _py_quote_ascii(text: str) -> str:
    from json import encoder

    quoted: str = encoder.py_encode_basestring_ascii(text)
    return quoted


tuple_field: Callable[[int, str], object] = _property_field
make_scanner: Callable[[object], Callable[[str, int], tuple[object, int]]] = _py_make_scanner
quote_ascii: Callable[[str], str] = _py_quote_ascii
if not PURE_PYTHON:
    try:
        from _collections import _tuplegetter as tuple_field  # type: ignore[no-redef]  # the C accessor replaces the fallback of the same signature
    except ImportError:  # another interpreter: the fallback above
        pass
    try:
        from _json import encode_basestring_ascii as quote_ascii, make_scanner  # type: ignore[assignment]  # _json's C make_scanner, typed as a class, is the callable the fallback is
    except ImportError:
        pass
