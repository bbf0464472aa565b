"""Keep attacker-controlled strings (tensor names, metadata) inert in human views."""

from __future__ import annotations

MAX_SHOWN = 200  # characters of one name shown in a human view


def inert_text(value: str, *, limit: int = MAX_SHOWN) -> str:
    """Escape control characters (newlines, ANSI ESC, BIDI overrides) and bound the length."""
    if len(value) <= limit and value.isascii() and value.isprintable():
        return value  # the common name: nothing to escape, no walk per character (C checks both)
    out = []
    for ch in value[: limit + 1]:
        code = ord(ch)
        if code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0 or 0x202A <= code <= 0x202E \
                or 0x2066 <= code <= 0x2069:
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    text = "".join(out)
    if len(value) > limit:
        text = text[:limit] + f"…(+{len(value) - limit} chars)"
    return text
