"""Templates: a header read before, with other names, is read again with one ``str.split``.

Kept only for a (form, buffer length) met before, bounded in number and in the text they hold.
"""

from __future__ import annotations

import re

from guard.readers.safetensors.pattern import OPENER_TEXTS, Frame, Span, plain_names
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorColumns

# A model's shards repeat a layout: the same dtypes, shapes and offsets in the same order under other names
# (layers 0-3 in one shard, 4-7 in the next).  Once a header has been read in columns (by the pattern or the
# parse), its text between the names is kept as a template with the spans and offsets it gave.  A later header
# with a buffer as long, cut at the same entry opener into as many pieces, each piece the template's text and
# then a plain name, is that header with other names: the same verdict, read with one ``str.split`` and no
# field taken apart.  Only the names are judged again (``_plain_names``; no quote in them, so each is one JSON
# string).  A template is kept for a (form, buffer length) met before, so shards that share no layout pay a
# dict lookup each; the templates' number and size are bounded.
_ENTRY_OPEN = (rb'":[ \t\n\r]*\{[ \t\n\r]*"(?:dtype"[ \t\n\r]*:[ \t\n\r]*"'
               rb'|data_offsets"[ \t\n\r]*:[ \t\n\r]*\[)')  # from a name's closing quote to its first value
_Template = tuple[list[str], str, int, list[Span], "list[int] | None"]
Cut = tuple[str, dict[str, str], int, int, str]  # a header's frame and the text that opens each entry
# (entry opener, buffer length) -> templates, latest first: (the text before each name, the last piece, the
# characters before the names, spans, begins or None)
_TEMPLATES: dict[tuple[str, int], list[_Template]] = {}
_MET: dict[tuple[str, int], None] = {}  # (entry opener, buffer length) met once, no template kept yet
_TEMPLATES_HELD, _TEMPLATES_PER_KEY, _TEMPLATE_BYTES = 256, 16, 1 << 19  # 512 KB: a shard's few thousand tensors
_TEMPLATE_CHARS = 1 << 24  # the text all templates hold together (16 M characters): a long-lived process's bound
_held = 0  # the characters kept since the templates were last emptied
# headers in a row that a key's templates did not read: past _TEMPLATES_PER_KEY (buffers as long, laid out
# otherwise: equal shards cycle through a few layouts, fewer than 16), one template is kept in _RETRY, not one
# per header (the split it costs, a fifth of the read)
_MISSES: dict[tuple[str, int], int] = {}
_RETRY = 64


def cut(raw: bytes, frame: Frame | None) -> Cut | None:
    """The header's frame and the text that opens each entry (the first one's, from its name's closing quote to
    its first value); None for a header no template could read."""
    if frame is None or len(raw) > _TEMPLATE_BYTES:
        return None
    head = raw[:4096]
    for opener_bytes, opener_text in OPENER_TEXTS:  # the pattern's forms (the library's first): no search
        if opener_bytes in head:
            return (*frame, opener_text)
    opener = re.search(_ENTRY_OPEN, head)
    return None if opener is None else (*frame, opener.group().decode("ascii"))


def from_template(cut: Cut, source: ByteSource, length: int) -> FileScan | None:
    """The scan of a header that is a kept template's with other names, or None."""
    text, metadata, start, close, sep = cut
    key = (sep, source.size - 8 - length)
    templates = _TEMPLATES.get(key)
    if not templates:
        return None
    # the last piece first: a layout that differs mostly differs there too (no split)
    last = text[text.rfind(sep, start, close + 1) + len(sep):close + 1]
    pieces: list[str] = []
    for leads, closing, chars, spans, begins in templates:
        if last != closing:
            continue
        pieces = pieces or text[start:close + 1].split(sep)
        if len(pieces) != len(leads) + 1:
            continue
        # each piece but the last is its lead and then a name: removeprefix leaves a piece whole where its
        # lead differs, so the names come out longer than the text between the leads by that lead
        names = list(map(str.removeprefix, pieces, leads))
        joined = "".join(names)
        if len(joined) != close + 1 - start - len(leads) * len(sep) - len(last) - chars:
            continue
        if '"' in joined or not plain_names(names, joined):
            return None
        _MISSES.pop(key, None)
        tensors = TensorColumns(names, spans, source.name, 8 + length, begins)
        return FileScan(source.name, "safetensors", source.size, tensors, (), metadata, 8 + length, ())
    _MISSES[key] = _MISSES.get(key, 0) + 1
    return None


def remember(cut: Cut, scan: FileScan) -> None:
    """Keep a header just read in columns as a template, the second time its (form, buffer length) is met."""
    global _held
    text, _, start, close, sep = cut
    tensors = scan.tensors
    if type(tensors) is not TensorColumns:
        return
    key = (sep, scan.size - tensors.base)
    templates = _TEMPLATES.get(key)
    if templates is None:
        if key not in _MET:
            if len(_MET) >= _TEMPLATES_HELD * 16:
                _MET.clear()
            _MET[key] = None
            return
        if len(_TEMPLATES) >= _TEMPLATES_HELD or _held > _TEMPLATE_CHARS:
            _forget()
        templates = _TEMPLATES[key] = []
    misses = _MISSES.get(key, 0)
    if misses >= _TEMPLATES_PER_KEY and misses % _RETRY:
        return  # the layouts kept were not met again: no template per header
    if text.find('"__metadata__"', start) >= 0:
        return  # a metadata key among the entries: a template holds no metadata
    pieces = text[start:close + 1].split(sep)
    names = tensors.names
    if len(pieces) != len(names) + 1 or not all(map(str.endswith, pieces, names)):
        return  # another cut than the entries'
    leads = [piece[:len(piece) - len(name)] for piece, name in zip(pieces, names)]
    chars = sum(map(len, leads))
    if _held > _TEMPLATE_CHARS:
        _forget()
        templates = _TEMPLATES[key] = []
    _held += chars + len(pieces[-1]) + 8 * len(leads)  # the text and the list's slots
    templates.insert(0, (leads, pieces[-1], chars, tensors.spans, tensors.begins))
    del templates[_TEMPLATES_PER_KEY:]


def _forget() -> None:
    global _held
    _TEMPLATES.clear()
    _MISSES.clear()
    _held = 0
