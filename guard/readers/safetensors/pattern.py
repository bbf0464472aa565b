"""The fast reading of a header in one of four known forms: one regular expression pass lists its entries.

``read_compact`` reads a header as the safetensors library writes it (compact), as ``json.dumps``
writes it (spaced), and either with each entry's keys sorted; anything it does not accept is left to
the parsed reading (``fast``) or to the reference (``reference``), which word every finding and error.
The spans of a ``(dtype, shape)`` and the tilings of a header's offsets are kept, bounded, for the
next header: a model's shards repeat a few of each.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from itertools import accumulate
from operator import itemgetter, sub

from guard import dtypes, jsonload
from guard.readers.safetensors.reference import U64, no_constant, unique_keys
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorColumns

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the hook's path (a scan never imports it)

# code -> (the code itself, its bits): the record keeps the table's own string, so 200,000 tensors
# of a sharded model share one "BF16" instead of holding one copy each from the JSON parse
KNOWN = {code: (code, info.bits) for code, info in dtypes.DTYPES.items()}
Span = tuple[str, tuple[int, ...], int]  # (code, shape, bytes), shared by every tensor of that dtype and shape
Frame = tuple[str, dict[str, str], int, int]  # a plain header's text, metadata, where entries start, its "}"


def needs_exact_parse(raw: bytes) -> bool:
    """Whether the header holds what the fast readings cannot judge (a superset: names may trip it too):
    a \\u escape, NaN, Infinity, a signed number (serde reads -0 as a float)."""
    # one byte first (memchr, an order faster than a substring search): most headers have none of them
    return ((b"\\" in raw and b"\\u" in raw) or (b"N" in raw and b"NaN" in raw)
            or (b"I" in raw and b"Infinity" in raw) or (b"-" in raw and re.search(rb"-\s*[0-9]", raw) is not None))


# the metadata object of a plain header: duplicate keys refused as the reference refuses them, by json's own
# decoder with these settings (guard.jsonload)
_scan_metadata = jsonload.decoder(object_pairs_hook=unique_keys, parse_constant=no_constant)
_METADATA_OPEN = r'\{[ \t\n\r]*"__metadata__"[ \t\n\r]*:[ \t\n\r]*'


def frame(raw: bytes) -> Frame | None:
    """A plain header's text, its metadata, where its entries start (after a metadata object that opens it, or at
    its opening brace) and where its closing brace is; None for what the fast readings leave to the reference:
    escapes, constants, signs, no closing brace before the padding, not UTF-8, metadata not all strings."""
    if b"\\" in raw or needs_exact_parse(raw):
        return None
    tail = raw[-8:]
    close = len(raw) - len(tail) + len(tail.rstrip(b" ")) - 1  # the library pads the header to 8 bytes
    if close < 0 or raw[close] != 0x7D:  # "}"
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    close -= len(raw) - len(text)  # the same place in characters: the padding is ASCII
    metadata: dict[str, str] = {}
    start = 0
    opened: int | None = 16 if text.startswith('{"__metadata__":{') else None  # the library's form: no search
    if opened is None:
        match = re.match(_METADATA_OPEN, text)
        opened = None if match is None else match.end()
    if opened is not None:
        try:
            value, start = _scan_metadata(text, opened)
        except (ValueError, RecursionError):  # JSONDecodeError, or a duplicate key or constant the hooks refuse
            return None
        if type(value) is not dict or not all(type(v) is str for v in value.values()):
            return None
        metadata = value
    return text, metadata, start, close


# The header as the safetensors library writes it (serde_json, compact): ``{"__metadata__":{...},``
# then ``"name":{"dtype":"BF16","shape":[8,4],"data_offsets":[0,64]}`` entries joined by commas.
# One regular expression pass lists its entries as strings, in C; a header in any other form (spaces,
# another key order, escapes in names, zero dims, numbers past 20 digits) goes to the JSON parse.
# Each match starts with its comma (the first, without metadata, with the header's opening brace), so
# matches with nothing between them tile the header: nothing in it was skipped.  Each field is taken up
# to the character that ends it (a dtype to its quote, a shape to its bracket, an offset to its comma or
# bracket): a class of "anything but" costs the engine least (11 % less than digits and word characters
# on a 20-component pipeline's 4,800 entries).  What a field holds is checked after the pattern, as the
# stricter classes once checked it (a word for a dtype, digits and commas for a shape, up to 20 digits for an
# offset): the dtype and the shape once per distinct pair (``_span_of_entry_key``: a known code, digits),
# the offsets together (each end the digits of the sum of the sizes before it: digits, no leading zero).
# A shape past 255 characters or an offset past 20 (never a real tensor's) goes to the JSON parse, which
# bounds its work on a hostile one.
_COMPACT = (r'([,{])"([^"]*)":\{"dtype":"([^"]+","shape":\[[^\]]{0,255})\],'
            r'"data_offsets":\[([^,]{1,20}),([^\]]{1,20})\]\}')
# The same entries as ``json.dumps`` writes them with its default separators (", " and ": "): what
# hand-rolled writers produce, and as valid a header as the library's.  A shape's key is brought to the
# compact form before it is judged, so both forms share one table of spans.
_SPACED = (r'(, |\{)"([^"]*)": \{"dtype": "([^"]+", "shape": \[[^\]]{0,255})\], '
           r'"data_offsets": \[([^,]{1,20}), ([^\]]{1,20})\]\}')
# Both again with each entry's keys sorted (``json.dumps(sort_keys=True)``: the offsets first), as valid a
# header again.  The dtype and the shape are still one span of text, the key of the same table.
_COMPACT_SORTED = (r'([,{])"([^"]*)":\{"data_offsets":\[([^,]{1,20}),([^\]]{1,20})\],'
                   r'"dtype":"([^"]+","shape":\[[^\]]{0,255})\]\}')
_SPACED_SORTED = (r'(, |\{)"([^"]*)": \{"data_offsets": \[([^,]{1,20}), ([^\]]{1,20})\], '
                  r'"dtype": "([^"]+", "shape": \[[^\]]{0,255})\]\}')


@functools.cache  # compiled on first use: a hook may read no header in these forms
def _split(spaced: bool, offsets_first: bool) -> Callable[[str], list[str]]:
    pattern = ((_SPACED_SORTED if spaced else _COMPACT_SORTED) if offsets_first
               else _SPACED if spaced else _COMPACT)
    return re.compile(pattern, re.ASCII).split


# how an entry opens in each form: a header without it is in none of them (its first entry is in the head)
_OPENERS = {(False, False): b'":{"dtype":"', (True, False): b'": {"dtype": "',
            (False, True): b'":{"data_offsets":[', (True, True): b'": {"data_offsets": ['}
OPENER_TEXTS = tuple((opener, opener.decode("ascii")) for opener in _OPENERS.values())
_ASCII_CONTROL = bytes([*range(0x20), 0x7F])  # the ASCII characters str.isprintable turns away
_SPANS: dict[str, Span | None] = {}  # ``BF16","shape":[8,4`` -> (code, shape, bytes)
_SPANS_HELD = 1 << 14  # bounded: a hostile file's distinct shapes
# a header's ends as text -> the sizes that spell them, and the last end
_TILINGS: dict[str, tuple[tuple[int, ...], int]] = {}
_TILINGS_HELD, _TILING_CHARS = 256, 8192  # bounded: 256 headers' offsets of up to 8,192 characters (2 MB)
SPAN_BYTES = itemgetter(2)
if TYPE_CHECKING:
    from typing import TypeGuard, TypeVar

    _T = TypeVar("_T")

    def all_set(items: list[_T | None]) -> TypeGuard[list[_T]]: ...
else:  # the builtin itself, which the checker reads as a guard: every span a non-empty tuple, so only None is false
    all_set = all


def read_compact(raw: bytes, source: ByteSource, length: int, framed: Frame | None = None) -> FileScan | None:
    """The scan of a header in the library's own compact form, or None for the general parse.

    What this accepts the general parse accepts with the same result: unique names, known dtypes,
    dims >= 1, offsets that tile the buffer (in header order, or sorted) with each span exactly its
    tensor's size.  Anything else (a finding, an error to word) is left to the general parse.
    ``framed``: the header's ``frame``, where the caller has it.
    """
    head = raw[:4096]
    spaced = b'"dtype":"' not in head
    dtype_at = head.find(b'"dtype": "' if spaced else b'"dtype":"')
    if dtype_at < 0:
        return None  # neither the library's compact form nor json.dumps'
    offsets_first = -1 < head.find(b'"data_offsets"') < dtype_at  # each entry's keys sorted
    if _OPENERS[spaced, offsets_first] not in head:
        return None  # another layout of the entries (indented, say): the pattern would match none of them
    if framed is None:
        framed = frame(raw)
        if framed is None:
            return None
    text, metadata, start, close = framed
    # split: the text between matches, then each match's five groups, alternating in one flat list (no
    # tuple per entry, no copy of the header); the entries tile the header between its metadata and its
    # closing brace when every text between them is empty and only the first opens with the brace
    parts = _split(spaced, offsets_first)(text)
    count = len(parts) // 6
    if not count or parts[0] != text[:start] or parts[-1] != text[close:] or any(parts[6:-1:6]):
        return None  # no tensor (the general parse judges an empty header), or something between the entries
    openers = parts[1::6]
    comma = ", " if spaced else ","
    if openers[0] != (comma if start else "{") or openers.count(comma) != count - (not start):
        return None
    names = parts[2::6]
    if not plain_names(names, "".join(names)):
        return None
    keys = parts[5::6] if offsets_first else parts[3::6]
    spans = _SPANS
    # all(): every span is a non-empty tuple, so a None is the only false item (a truth test per item
    # where ``None in infos`` made a rich comparison of each tuple with None)
    infos = list(map(spans.get, keys))
    if not all_set(infos):  # a (dtype, shape) this process has not met yet, or one without a span
        fresh = {key: _span_of_entry_key(key, spaced) for key in set(keys).difference(spans)}
        # the file's own spans come from `infos` and `fresh`, never from the cache after it is emptied: a
        # long-lived process (the Hub reviewer) fills it, and a clear between two of a file's keys lost one
        if len(spans) + len(fresh) > _SPANS_HELD:
            spans.clear()
        spans.update(fresh)
        infos = [fresh.get(key) if info is None else info for key, info in zip(keys, infos)]
        if not all_set(infos):
            return None
    # offsets tile the buffer in header order: each begin the previous end, compared as the text itself,
    # and each end the sum of the sizes up to its tensor, spelled as JSON spells it (str of the int: only
    # digits, no leading zero, no sign): one comparison checks the form and the value of every offset
    begins_text = parts[3::6] if offsets_first else parts[4::6]
    ends_text = parts[4::6] if offsets_first else parts[5::6]
    buffer_start = 8 + length
    begins = None  # the offsets tile the buffer in header order
    if begins_text[0] == "0" and begins_text[1:] == ends_text[:-1]:
        # each end the sum of the sizes up to it, in JSON's spelling: worked out once per tiling, which the
        # shards of a model share (the same layers' shapes), then looked up by the ends' text
        sizes = tuple(map(SPAN_BYTES, infos))
        spelled = ",".join(ends_text)
        known = _TILINGS.get(spelled)
        if known is None or known[0] != sizes:
            ends = list(accumulate(sizes))  # every size is a byte or more: no end is 0, none repeats
            if list(map(str, ends)) != ends_text:
                return None
            known = (sizes, ends[-1])
            if len(spelled) <= _TILING_CHARS:  # a shard's few hundred tensors; a file of thousands is its own
                if len(_TILINGS) >= _TILINGS_HELD:
                    _TILINGS.clear()
                _TILINGS[spelled] = known
        if known[1] != source.size - buffer_start:
            return None
    else:  # in another order (as valid): each offset in JSON's own spelling, each span its size, tiling sorted
        # JSON's spelling of an unsigned int: ASCII digits only (no sign, space, underscore or other script's
        # digit, all of which int() takes), and no leading zero.  With each text after a comma, a text that
        # starts with "0" but is not "0" is a ",0" with no comma after it (two "0"s in a row, never valid
        # offsets, can count as one such and go to the JSON parse: a miss of the shortcut, never a wrong read)
        digits = "".join(begins_text) + "".join(ends_text)
        listed = f",{','.join(begins_text)},{','.join(ends_text)}"
        if not (digits.isascii() and digits.isdigit()) or \
                listed.count(",0") != listed.count(",0,") + listed.endswith(",0"):
            return None
        begins, ends = list(map(int, begins_text)), list(map(int, ends_text))
        if list(map(sub, ends, begins)) != list(map(SPAN_BYTES, infos)):
            return None
        if not tiles(begins, ends, source.size - buffer_start):
            return None
    # the tensors in columns (guard.tensors.TensorColumns): the names and the spans shared with every header
    # of the same dtype and shape (the offsets follow from them where they are in header order); records are
    # made only for a caller that walks them
    tensors = TensorColumns(names, infos, source.name, buffer_start, begins)
    # positional, all eight fields: the record's fast path (a scan of 4,000 shards builds 4,000 of these)
    return FileScan(source.name, "safetensors", source.size, tensors, (), metadata, 8 + length, ())


def plain_names(names: list[str], joined: str) -> bool:
    """Whether names read from a header's text are each its own JSON string, once, and none the metadata's key.

    A duplicate, a tensor named ``__metadata__`` (a second metadata key, or one the general parse takes for
    the metadata), or a control character (not allowed in a JSON string; isprintable also turns away DEL and
    non-printing code points, which the general parse then judges): the general parse.  ASCII names (the
    usual ones) are printable when their bytes hold no C0 control and no DEL: the same verdict as
    str.isprintable, found by a table lookup per byte where isprintable looks up each character's Unicode
    category (about 1 % of a hook's call on a 20-component pipeline commit)."""
    unique = set(names)
    return len(unique) == len(names) and "__metadata__" not in unique and (
        len(joined.encode().translate(None, _ASCII_CONTROL)) == len(joined) if joined.isascii()
        else joined.isprintable())


def tiles(begins: list[int], ends: list[int], buffer_len: int) -> bool:
    """Whether spans of a byte or more tile the buffer, in any order: the sorted begins are 0 and then the
    sorted ends but the last, which is the buffer's length (the span with the least end is the one at 0,
    the next starts at its end, and so on: no gap, no overlap, nothing past the end)."""
    first_to_last, last_to_first = sorted(begins), sorted(ends)
    return first_to_last[0] == 0 and last_to_first[-1] == buffer_len and first_to_last[1:] == last_to_first[:-1]


_DIM_CHARACTERS = frozenset("0123456789,")  # a shape's text in the compact form: digits and commas
_SPACED_DIM_CHARACTERS = frozenset("0123456789, ")


def _span_of_entry_key(key: str, spaced: bool) -> Span | None:
    """The span of a key the pattern took (a dtype up to its quote, a shape of up to 255 characters up
    to its bracket), or None: a shape of anything but digits, commas (and the spaced form's spaces) goes
    to the JSON parse, as the pattern's digit classes sent it there; an unknown dtype does (``span_of``)."""
    dims = key.partition('", "shape": [' if spaced else '","shape":[')[2]
    if not (_SPACED_DIM_CHARACTERS if spaced else _DIM_CHARACTERS).issuperset(dims):
        return None
    return _span_of_key(_compact_key(key) if spaced else key)


def _compact_key(key: str) -> str:
    """``BF16", "shape": [8, 4`` as the compact form writes it; other spacing is left to the JSON parse."""
    dtype, _, dims = key.partition('", "shape": [')
    dims = dims.replace(", ", ",")
    return f'{dtype}","shape":[{dims}' if " " not in dims else '","shape":[,'  # the second: no span


def _span_of_key(key: str) -> Span | None:
    dtype, _, dims = key.partition('","shape":[')
    numbers = dims.split(",") if dims else []
    if not all(0 < len(dim) <= 20 and dim[0] != "0" for dim in numbers):
        return None  # an empty dim, a leading zero (not JSON), a zero dim, or past 20 digits: the general parse
    return span_of(dtype, [int(dim) for dim in numbers])


def span_of(dtype: object, dims: object) -> Span | None:
    """(code, shape, bytes) of a known dtype with dims >= 1 in whole bytes; None for anything else, which
    the reference judges (an unknown dtype's CG005, an empty tensor, an error to word)."""
    known = KNOWN.get(dtype) if type(dtype) is str else None
    if known is None or type(dims) is not list:
        return None
    numel = 1
    for dim in dims:
        if type(dim) is not int or dim < 1:
            return None
        numel *= dim
    total = numel * known[1]
    if total >= U64 or total % 8:
        return None
    return known[0], tuple(dims), total >> 3
