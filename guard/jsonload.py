"""``json.loads``, and ``json.dumps`` of a string, without ``import json``: json's own C functions.

``import json`` compiles six regular expressions (its decoder's and its encoder's) in pure Python:
~4 M instructions, 2-4 % of a pre-commit hook's call (a 20-component pipeline commit, a 20-shard
one), which parses JSON and spells a key or two as JSON (a config dtype's line) but writes no
document.  The work itself is done by the C functions that json calls (``_json.make_scanner``,
``_json.encode_basestring_ascii``, or json's pure-Python ones: ``guard._speedups`` chooses); this module
calls them with json's own default settings.  Anything but a clean parse (an error, a BOM, data after
the value) goes to json itself, which returns or raises exactly what it always does: callers see json's
values and json's errors, worded as json words them.
"""

from __future__ import annotations

from collections.abc import Callable

from guard._speedups import make_scanner, quote_ascii

_SPACE = " \t\n\r"  # json.decoder.WHITESPACE: what may surround the value
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}

Scan = Callable[[str, int], tuple[object, int]]


def scanner(*, object_pairs_hook: Callable[..., object] | None = None,
            parse_constant: Callable[[str], object] | None = None) -> Scan:
    """``json.JSONDecoder(...).scan_once`` for these settings: ``(value, end)`` of the value at an index,
    StopIteration where none starts there."""
    settings = type("Settings", (), {  # the attributes JSONDecoder's constructor sets and the scanner reads
        "strict": True, "object_hook": None, "object_pairs_hook": object_pairs_hook, "parse_float": float,
        "parse_int": int, "parse_constant": parse_constant or _CONSTANTS.__getitem__,
    })
    return make_scanner(settings)


_scan = scanner()


def loads(text: str) -> object:
    """``json.loads(text)``, for a str: the same value, or json's own error."""
    if type(text) is str and not text.startswith("\ufeff"):
        decoded = _decode(text)
        if decoded:
            return decoded[0]
    import json  # an error to word

    return json.loads(text)


def _decode(text: str) -> tuple[object, ...]:
    """``(value,)`` as ``JSONDecoder.decode`` finds it, or ``()`` for whatever json.loads is to judge itself.

    loads, _decode, _raw_decode: the scanner runs as many Python frames deep as in json.loads (loads,
    decode, raw_decode), so a deeply nested value meets the recursion limit exactly where it does there."""
    start = len(text) - len(text.lstrip(_SPACE))
    try:
        value, end = _raw_decode(text, start)
    except (StopIteration, ValueError, RecursionError):
        return ()
    return (value,) if len(text.rstrip(_SPACE)) <= end else ()  # nothing but white space after the value


def _raw_decode(text: str, start: int) -> tuple[object, int]:
    return _scan(text, start)


def quoted(text: str) -> str:
    """``json.dumps(text)`` for a str: its string literal, non-ASCII characters escaped (``ensure_ascii``)."""
    if type(text) is str:
        return quote_ascii(text)  # what json.dumps' default encoder returns for a str
    import json

    return json.dumps(text)
