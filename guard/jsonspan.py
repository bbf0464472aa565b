"""Where a value sits in a JSON text: the span of its token, for byte-exact edits.

``find_values(text, ("text_config", "torch_dtype"))`` walks the text once, with an explicit
stack (no recursion, whatever the nesting), and returns the span of every scalar value
token at that key path: every one, since a key may repeat in one object (``json.loads``
keeps the last).  Keys are compared decoded (``"torch\\u005fdtype"`` is ``torch_dtype``);
an array element's step in a path is its index.  Text that ``json.loads`` would refuse
raises ``JsonSpanError``.  Pure: no I/O, standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from guard.records import Record

_PLAIN = r'[^"\\\x00-\x1f]*'  # what json.loads accepts between escapes (strict: no control characters)
_STRING = re.compile(rf'"{_PLAIN}(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{{4}}){_PLAIN})*"')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_SPACE = re.compile(r"[ \t\n\r]*")
_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")  # json.loads takes the last three


class JsonSpanError(ValueError):
    pass


class Span(Record):
    start: int  # character offsets into the text: text[start:end] is the token
    end: int
    offset: int  # the same in UTF-8 bytes: the file's own bytes
    length: int
    line: int  # 1-based
    column: int  # 1-based, in code points (SARIF's unicodeCodePoints)
    token: str  # the raw token, quotes and escapes included

    def to_json(self) -> dict[str, object]:
        return {"offset": self.offset, "length": self.length, "line": self.line, "column": self.column,
                "old": self.token}


def find_values(text: str, path: tuple[str | int, ...]) -> list[Span]:
    """The scalar value token of every occurrence of ``path`` (object keys from the top), in text order."""
    return [span_of(text, start, end) for start, end in _tokens_at(text, path)]


def span_of(text: str, start: int, end: int) -> Span:
    offset = len(text[:start].encode("utf-8"))
    line_start = text.rfind("\n", 0, start) + 1
    return Span(start, end, offset, len(text[start:end].encode("utf-8")), text.count("\n", 0, start) + 1,
                start - line_start + 1, text[start:end])


def _tokens_at(text: str, wanted: tuple[str | int, ...]) -> Iterator[tuple[int, int]]:
    """(start, end) of each scalar at ``wanted``; every other value is still tokenized (and checked).

    One frame per open container: (is an object, whether it lies on ``wanted``, its current
    element's index): memory grows with the depth, never with the depth squared.
    """
    stack: list[tuple[bool, bool, int]] = []
    pos = _skip(text, 0)
    on_path = True  # does the value starting at pos lie at ``wanted``, or on the way to it?
    while True:  # a value starts at pos
        ch = text[pos:pos + 1]
        if ch in ("{", "["):
            is_object = ch == "{"
            pos = _skip(text, pos + 1)
            if text[pos:pos + 1] != ("}" if is_object else "]"):
                stack.append((is_object, on_path, 0))
                pos, on_path = _first_step(text, pos, stack, wanted)
                continue
            pos += 1  # an empty container: a finished value
        else:
            end = _scalar_end(text, pos)
            if on_path and len(stack) == len(wanted):
                yield pos, end
            pos = end
        while True:  # a value ended: a comma, a closing bracket, or the end of the text
            pos = _skip(text, pos)
            if not stack:
                if pos != len(text):
                    raise JsonSpanError(f"extra data at character {pos}")
                return
            is_object, container_on_path, index = stack[-1]
            ch = text[pos:pos + 1]
            if ch == ",":
                stack[-1] = (is_object, container_on_path, index + 1)
                pos, on_path = _first_step(text, _skip(text, pos + 1), stack, wanted)
                break
            if ch != ("}" if is_object else "]"):
                raise JsonSpanError(f"expected ',' or a closing bracket at character {pos}")
            stack.pop()
            pos += 1


def _first_step(text: str, pos: int, stack: list[tuple[bool, bool, int]],
                wanted: tuple[str | int, ...]) -> tuple[int, bool]:
    """Past the key of an object member (or nothing, in an array): where its value starts, and
    whether that value lies on ``wanted``."""
    is_object, container_on_path, index = stack[-1]
    depth = len(stack) - 1
    step: str | int
    if is_object:
        pos, step = _key(text, pos)
    else:
        step = index
    on_path = container_on_path and depth < len(wanted) and wanted[depth] == step \
        and type(wanted[depth]) is type(step)
    return pos, on_path


def _key(text: str, pos: int) -> tuple[int, str]:
    match = _STRING.match(text, pos)
    if match is None:
        raise JsonSpanError(f"expected a key at character {pos}")
    key = json.loads(match.group())
    pos = _skip(text, match.end())
    if text[pos:pos + 1] != ":":
        raise JsonSpanError(f"expected ':' at character {pos}")
    return _skip(text, pos + 1), key


def _scalar_end(text: str, pos: int) -> int:
    literal = next((word for word in _LITERALS if text.startswith(word, pos)), None)
    if literal is not None:
        return pos + len(literal)
    match = (_STRING if text[pos:pos + 1] == '"' else _NUMBER).match(text, pos)
    if match is None:
        raise JsonSpanError(f"malformed value at character {pos}")
    return match.end()


def _skip(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    assert match is not None  # _SPACE matches the empty string: always a match
    return match.end()
