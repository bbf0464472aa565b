"""What CG128 reads of a tokenizer beyond its JSON configs: tokenizer.json's added tokens, a chat template's text.

tokenizer.json is tens of MB (its vocabulary and merges); its ``added_tokens`` (every special token, with its id)
come before them: the tokenizers library writes ``version``, ``truncation``, ``padding``, ``added_tokens``, then
the rest.  Only the head is read, a larger one only where the list runs past it.  Nothing here is a finding: a
tokenizer.json this cannot read gives CG128 less to compare, never an error of its own.
"""

from __future__ import annotations

from guard import jsonload
from guard.errors import MalformedCheckpoint
from guard.sources import ByteSource

HEADS = (1 << 20, 16 << 20, 64 << 20)  # bytes read for the added tokens: a first try, then larger
MAX_TEMPLATE = 4 << 20
AddedToken = tuple[int, str, bool]  # (id, content, special)


def read_token_file(name: str, data: bytes | ByteSource) -> object | None:
    """tokenizer.json: its added tokens; chat_template.jinja: its text; None where it cannot be read."""
    try:
        if name == "tokenizer.json":
            return added_tokens(data)
        raw = data if isinstance(data, bytes) else data.read_at(0, min(data.size, MAX_TEMPLATE + 1))
        return None if len(raw) > MAX_TEMPLATE else raw.decode("utf-8", "replace")
    except (OSError, MalformedCheckpoint):
        return None


def added_tokens(data: bytes | ByteSource) -> tuple[AddedToken, ...] | None:
    size = len(data) if isinstance(data, bytes) else data.size
    for limit in HEADS:
        head = data[:limit] if isinstance(data, bytes) else data.read_at(0, min(size, limit))
        found = _added_tokens_in(head)
        if found is not None or len(head) >= size:
            return found
    return None


def _added_tokens_in(head: bytes) -> tuple[AddedToken, ...] | None:
    key = head.find(b'"added_tokens"')
    if key < 0:
        return None
    text = head[key:].decode("utf-8", "ignore")  # a character cut at the end of the head: dropped
    colon = text.find(":", len('"added_tokens"'))
    if colon < 0:
        return None
    rest = text[colon + 1:]
    start = colon + 1 + len(rest) - len(rest.lstrip(" \t\r\n"))
    if text[start:start + 1] != "[":
        return None
    try:
        tokens, _ = jsonload.decoder()(text, start)
    except (ValueError, RecursionError):  # cut short by the head, or not JSON
        return None
    if not isinstance(tokens, list):
        return None
    out = []
    for token in tokens:
        if isinstance(token, dict) and type(token.get("id")) is int and isinstance(token.get("content"), str):
            out.append((token["id"], token["content"], token.get("special") is True))
    return tuple(out)
