"""The fast reading of a header, behind one function: ``read_fast``, or None for the reference to read.

Three tiers, cheapest first, each accepting only what the reference (``reference.read_parsed``) accepts
with no finding and no error, and giving what it gives (the fuzz differential in
tests/test_safetensors_compact.py and tests/test_safetensors_templates.py holds them to it):
- a template (``templates``): a header read before with other names, one ``str.split``;
- the pattern (``pattern``): a header in one of the four forms the library and ``json.dumps`` write;
- the parsed header in columns (below): any other valid header whose numbers are all ints.
Each keeps the tensors in columns (``TensorColumns``): no record per tensor until a caller walks them.
These tiers, with their bounded caches, are what the pre-commit hook's figure and the 200,000-tensor scan
rest on (docs/benchmarks.md); the rest of the package reads plainly.
"""

from __future__ import annotations

import functools
from operator import itemgetter, sub

from guard.readers.safetensors.pattern import (
    SPAN_BYTES,
    Span,
    all_set,
    frame,
    needs_exact_parse,
    read_compact,
    span_of,
    tiles,
)
from guard.readers.safetensors.templates import cut, from_template, remember
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorColumns

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the hook's path (a scan never imports it)
if TYPE_CHECKING:
    import json


def read_fast(raw: bytes, source: ByteSource, length: int) -> FileScan | None:
    """The scan of a header's bytes by the first tier that takes it, or None: the reference's to read."""
    framed = frame(raw)
    cutting = cut(raw, framed)
    if cutting is not None:
        scan = from_template(cutting, source, length)
        if scan is not None:
            return scan
    scan = None if framed is None else read_compact(raw, source, length, framed)
    if scan is None:
        scan = _read_parsed(raw, source, length)
    if scan is not None and cutting is not None:
        remember(cutting, scan)
    return scan


def _refuse_float(text: str) -> float:
    raise ValueError("a float: not a plain header")


@functools.cache  # made at the first header in no pattern's form: the hook's headers never need it
def _plain_decoder() -> json.JSONDecoder:
    """json.loads' own C scanner, except that a float (never in a valid header) ends the fast parse."""
    import json

    return json.JSONDecoder(parse_float=_refuse_float)


def _parse_plain(raw: bytes) -> dict[str, object] | None:
    """The header parsed at C speed when it is plain (no float, ``true``, ``false``, constant, sign or \\u
    escape: every number an int) and holds no duplicate key; else None.

    A pairs hook costs a Python call and a list of pairs per object (40 % of the parse of a
    120-tensor header).  Instead: every key of every object is followed by a colon outside
    strings, so the colons in the text are at least the keys; the lengths of the objects
    counted below are at most the keys, and fewer where a duplicate collapsed.  Equal
    counts leave no room for a duplicate.  Anything else (colons in names, deeper
    objects) goes to the reference.
    """
    if needs_exact_parse(raw) or b"true" in raw or b"false" in raw:
        return None
    try:
        header = _plain_decoder().decode(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if type(header) is not dict:
        return None
    values = header.values()  # every value an object (a valid header's): their keys counted in C
    keys = sum(map(len, values)) if set(map(type, values)) == {dict} else sum(
        [len(entry) for entry in values if type(entry) is dict])
    return header if raw.count(b":") == len(header) + keys else None


_DTYPE_OF, _SHAPE_OF, _OFFSETS_OF = itemgetter("dtype"), itemgetter("shape"), itemgetter("data_offsets")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_PARSED_SPANS: dict[tuple[object, tuple[object, ...]], Span | None] = {}  # (dtype, shape) -> span, bounded
_PARSED_SPANS_HELD = 1 << 14  # a hostile file's distinct shapes


def _read_parsed(raw: bytes, source: ByteSource, length: int) -> FileScan | None:
    """The scan of a plain header (every number an int) in columns, or None for the reference.

    Any valid header, whatever its form (another key order, ``sort_keys``, indentation): each field
    is taken and checked a column at a time, in C (the indented form of the 200,000-tensor scan: 0.99x a
    ``safe_open`` listing, docs/benchmarks.md).  It accepts what the reference accepts with no finding
    and no error, with the same records: a known dtype with dims >= 1 on each tensor, each span exactly
    its size, the spans tiling the buffer in any order.  Anything else is the reference's to word.
    """
    header = _parse_plain(raw)
    if header is None:
        return None
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    elif type(metadata) is not dict or not all(type(value) is str for value in metadata.values()):
        return None
    entries = list(header.values())
    if not entries:
        return None
    # each step raises TypeError or KeyError on what the reference would not pass as it is: an entry that is
    # no object, a missing key, offsets that are not a pair of ints (only ints subtract: the parse is plain,
    # no float, no true or false), an unhashable dtype or dim.  A shape that is no list (a string, an object)
    # gives dims that are strings, which no span passes: the reference words all of these
    try:
        offsets = list(map(_OFFSETS_OF, entries))  # type: ignore[arg-type]  # entries are the header's dicts (a TypeError is caught below)
        if set(map(len, offsets)) != {2}:
            return None
        begins, ends = list(map(_FIRST, offsets)), list(map(_SECOND, offsets))
        sizes_given = list(map(sub, ends, begins))
        keys = list(zip(map(_DTYPE_OF, entries), map(tuple, map(_SHAPE_OF, entries))))  # type: ignore[arg-type]  # entries are the header's dicts (a TypeError is caught below); hashable: checked once a pair
        infos = list(map(_PARSED_SPANS.get, keys))
    except (TypeError, KeyError):
        return None
    if not all_set(infos):
        fresh = {key: span_of(key[0], list(key[1])) for key in set(keys).difference(_PARSED_SPANS)}
        if len(_PARSED_SPANS) + len(fresh) > _PARSED_SPANS_HELD:
            _PARSED_SPANS.clear()
        _PARSED_SPANS.update(fresh)
        infos = [fresh.get(key) if info is None else info for key, info in zip(keys, infos)]
        if not all_set(infos):
            return None  # an unknown dtype, an empty tensor, a bad shape: the reference words it
    if sizes_given != list(map(SPAN_BYTES, infos)):
        return None
    buffer_start = 8 + length
    if not tiles(begins, ends, source.size - buffer_start):
        return None
    in_order = begins == [0, *ends[:-1]]
    tensors = TensorColumns(list(header), infos, source.name, buffer_start, None if in_order else begins)
    return FileScan(source.name, "safetensors", source.size, tensors, (), metadata, 8 + length, ())
