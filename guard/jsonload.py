"""The one JSON reader: every JSON document the tool reads comes through here, by the standard library's public API.

Configs, shard indexes, generation and tokenizer configs, quantization configs, the tool's own reports, the Hub's
answers: a person edits them by hand, a download cuts them short, a hostile repository writes anything.  For any
bytes, ``loads`` returns json's value or raises one ``ValueError`` subclass, ``JSONError`` (a ``JSONDecodeError``:
callers that catch either keep working), whose one-line message ``describe`` words for a finding; ``parse`` and
``read`` name the file in it.  Nothing else escapes: not a RecursionError (a document nested deeper than the
interpreter's limit), not a UnicodeDecodeError (bytes that are not UTF-8), and never the ``SystemError`` that
CPython's private ``_json`` scanner raised on Python 3.10 and 3.11 when it was called without ``json.decoder``
imported (issue 46: a trailing comma in config.json crashed the scan and the pre-commit hook).  That private scanner
saved ``import json`` (3-4 % of the hook's instructions, below the 5 % a private module must buy:
docs/benchmarks.md), so it is gone: tests/test_jsonload.py holds this module to its word with Hypothesis on every
Python the package claims.

What is read is what json.loads reads, as the loaders read it (transformers: ``json.loads`` of the text): NaN and
Infinity are numbers, a duplicate key keeps its last value.  A UTF-8 BOM is refused in text (as json.loads refuses
it, and transformers with it).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the hook's path (a scan never imports it)
if TYPE_CHECKING:
    from typing import Any

MAX_BYTES = 64 * 1024 * 1024  # a config, an index, a tokenizer: larger is no document the tool reads whole


class JSONError(json.JSONDecodeError):
    """A document that is not JSON, or not readable: ``str()`` is one line (the file's name first, where known)."""

    def __init__(self, msg: str, doc: str = "", pos: int = 0, *, name: str = "") -> None:
        super().__init__(msg, doc, pos)
        self.name = name
        line = msg.splitlines()[0][:300] if msg else "not valid JSON"
        self.args = (f"{name}: {line}" if name else line,)

    def __str__(self) -> str:
        return str(self.args[0])


def loads(text: str | bytes | bytearray, **settings: Any) -> Any:
    """``json.loads(text, **settings)``: the same value, or ``JSONError`` (json's own words where json has them)."""
    try:
        return json.loads(text, **settings)
    except json.JSONDecodeError as exc:
        raise JSONError(f"not valid JSON: {exc}", exc.doc, exc.pos) from None
    except UnicodeDecodeError as exc:  # bytes: json decodes them itself (UTF-8, -16 or -32 by their first bytes)
        raise JSONError(f"not valid JSON: not {exc.encoding.upper()} ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise JSONError("not valid JSON: nested too deeply to read") from None
    except ValueError as exc:  # int's digit limit (a number of over 4,300 digits); a subclass is a hook's own
        if type(exc) is not ValueError:
            raise
        raise JSONError(f"not valid JSON: {exc}" if str(exc) else "not valid JSON") from None


def _may_hold_surrogates(text: str) -> bool:
    """An escape json turns into a surrogate (paired, or lone) is in the text (strict UTF-8 holds none itself).
    The search is compiled only where a ``\\u`` is (re's cache)."""
    return "\\u" in text and re.search(r"\\u[dD][89a-fA-F]", text) is not None


def _lone_surrogate(value: object) -> str | None:
    """The first lone surrogate in the value's strings (keys included), or None; a walk with its own stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return item[exc.start]
    return None


def parse(data: bytes | bytearray | str, name: str, **settings: Any) -> Any:
    """A file's JSON from its bytes, decoded as UTF-8 the way the loaders open it; ``JSONError`` naming ``name``.

    One refusal json does not make: a lone surrogate escape (``"\\ud800"``).  json returns a str no UTF-8 text can
    hold, which no output (a terminal, a report) could write, nor the loaders save again."""
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONError(f"not valid JSON: not UTF-8 ({exc.reason} at byte {exc.start})", name=name) from None
    try:
        value = loads(text, **settings)
    except JSONError as exc:
        raise JSONError(str(exc), exc.doc, exc.pos, name=name) from None
    if _may_hold_surrogates(text):
        lone = _lone_surrogate(value)
        if lone is not None:
            raise JSONError(f"not valid JSON: a lone surrogate escape (\\u{ord(lone):04x}): no UTF-8 text holds it",
                            name=name)
    return value


def read(path: str | os.PathLike[str], *, name: str | None = None, limit: int = MAX_BYTES, **settings: Any) -> Any:
    """A JSON file's value; ``JSONError`` naming the file where it cannot be read, is too large, or is not JSON."""
    shown = name if name is not None else os.fspath(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise JSONError(f"could not be read ({exc.strerror or type(exc).__name__})", name=shown) from None
    if len(data) > limit:
        raise JSONError(f"larger than {limit:,} bytes: not read", name=shown)
    return parse(data, shown, **settings)


def describe(exc: BaseException) -> str:
    """The one-line reason of a failed read, for a finding that names the file itself."""
    if isinstance(exc, JSONError) and exc.name:
        text = str(exc)[len(exc.name) + 2:]
    else:
        text = str(exc)
    text = text.removeprefix("not valid JSON: ")
    return text.splitlines()[0][:200] if text.strip() else type(exc).__name__


def decoder(*, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
            parse_constant: Callable[[str], Any] | None = None) -> Callable[[str, int], tuple[Any, int]]:
    """``JSONDecoder(...).raw_decode``: ``(value, end)`` of the value at an index; a ValueError where none is
    (``JSONDecodeError``, or the caller's hook), RecursionError for a value nested too deeply."""
    return json.JSONDecoder(object_pairs_hook=object_pairs_hook, parse_constant=parse_constant).raw_decode


def quoted(text: str) -> str:
    """``json.dumps(text)`` for a str: its string literal, non-ASCII characters escaped (``ensure_ascii``)."""
    return json.dumps(text)
