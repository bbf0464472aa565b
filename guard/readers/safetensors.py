"""safetensors: the 8-byte length, the JSON header, nothing else."""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable
from itertools import accumulate
from operator import itemgetter, sub

from guard import dtypes, jsonload
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorColumns, TensorInfo

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hook's path)
if TYPE_CHECKING:
    import json

MAX_HEADER_SIZE = 100_000_000  # the reference (Rust) implementation's cap
# code -> (the code itself, its bits): the record keeps the table's own string, so 200,000 tensors
# of a sharded model share one "BF16" instead of holding one copy each from the JSON parse
_KNOWN = {code: (code, info.bits) for code, info in dtypes.DTYPES.items()}
_new_record = tuple.__new__  # TensorInfo's fields in order, half the cost of its Python __new__ (once per tensor)


def read_safetensors_header(source: ByteSource) -> tuple[int, dict[str, object]]:
    """Return (header length, parsed header) after the framing checks."""
    length, header, _ = _read_header(source)
    return length, header


def _read_header(source: ByteSource) -> tuple[int, dict[str, object], bool]:
    length, raw = _framed(source)
    return (length, *_parse(raw))


def _framed(source: ByteSource) -> tuple[int, bytes]:
    """The header's length and bytes, after the framing checks."""
    if source.size < 8:
        raise MalformedCheckpoint(f"file is {source.size} bytes, too short for a safetensors header")
    (length,) = struct.unpack("<Q", source.read_at(0, 8))
    if length > MAX_HEADER_SIZE:
        raise MalformedCheckpoint(f"header length {length:,} exceeds the {MAX_HEADER_SIZE:,}-byte limit")
    if 8 + length > source.size:
        raise MalformedCheckpoint(f"header length {length:,} runs past the end of the file")
    return length, source.read_at(8, length)


def parse_header(raw: bytes) -> dict[str, object]:
    return _parse(raw)[0]


def _parse(raw: bytes) -> tuple[dict[str, object], bool]:
    """The parsed header, and whether it is plain: parsed by the fast path, with no float, ``true`` or
    ``false`` anywhere in it, so every number in it is an int (which lets equal shapes share a check)."""
    import json  # the general parse: a header in neither fast form (guard.jsonload says why json waits)

    plain = False
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedCheckpoint(f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        if _needs_exact_parse(raw):
            # parse_constant/parse_int: the Rust reader (serde_json) refuses NaN and reads -0 as a float;
            # a \\u escape may decode to a lone surrogate, which no UTF-8 output could hold
            header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                                parse_int=_json_int)
        else:  # the common header: no escapes, no signs, no constants; only duplicates to refuse
            header, plain = _parse_unique(raw, text)
    except json.JSONDecodeError as exc:
        raise MalformedCheckpoint(f"header is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(header, dict):
        raise MalformedCheckpoint("header is not a JSON object")
    return header, plain and b"true" not in raw and b"false" not in raw


def _needs_exact_parse(raw: bytes) -> bool:
    """Whether the header holds what the fast parse cannot judge (a superset: names may trip it too)."""
    # one byte first (memchr, an order faster than a substring search): most headers have none of them
    return ((b"\\" in raw and b"\\u" in raw) or (b"N" in raw and b"NaN" in raw)
            or (b"I" in raw and b"Infinity" in raw) or (b"-" in raw and re.search(_SIGNED, raw) is not None))


_SIGNED = rb"-\s*[0-9]"  # a number with a sign (serde reads -0 as a float); compiled on first need, re caches it


def _refuse_float(text: str) -> float:
    raise ValueError("a float: not a plain header")


@functools.cache  # made at the general parse's first use: the fast forms never need it
def _plain_decoder() -> json.JSONDecoder:
    """json.loads' own C scanner, except that a float (never in a valid header) ends the fast parse."""
    import json

    return json.JSONDecoder(parse_float=_refuse_float)


def _parse_unique(raw: bytes, text: str) -> tuple[object, bool]:
    """json.loads at C speed, then proof that no object lost a key to a duplicate; else the hooked parse.

    A pairs hook costs a Python call and a list of pairs per object (40 % of the parse of a
    120-tensor header).  Instead: every key of every object is followed by a colon outside
    strings, so the colons in the text are at least the keys; the lengths of the objects
    counted below are at most the keys, and fewer where a duplicate collapsed.  Equal
    counts leave no room for a duplicate.  Anything else (colons in names, deeper
    objects, a header that is not an object, a failed parse whose error a duplicate
    before it would have changed) is judged by the hooked parse, exactly as before.
    """
    try:
        header = _plain_decoder().decode(text)
    except (ValueError, RecursionError):
        pass
    else:
        if type(header) is dict:
            values = header.values()  # every value an object (a valid header's): their keys counted in C
            keys = sum(map(len, values)) if set(map(type, values)) == {dict} else sum(
                [len(entry) for entry in values if type(entry) is dict])
            if raw.count(b":") == len(header) + keys:
                return header, True
    import json

    return json.loads(text, object_pairs_hook=_unique_keys), False


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise MalformedCheckpoint(f"duplicate key {duplicate!r} in header")
    return out


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise MalformedCheckpoint(f"duplicate key {key!r} in header")
        for text in (key, value) if isinstance(value, str) else (key,):
            # a lone surrogate (\ud800) decodes in Python but is not UTF-8: no output could encode it
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise MalformedCheckpoint("header holds a lone UTF-16 surrogate escape") from None
        out[key] = value
    return out


def _no_constant(name: str) -> object:
    raise MalformedCheckpoint(f"header holds {name}, which is not JSON")


# the metadata object of a compact header: duplicate keys refused as the general parse refuses them, by
# json.JSONDecoder's C scanner with these settings (guard.jsonload: a hook's commit never imports json)
_metadata_scan = jsonload.scanner(object_pairs_hook=_unique_keys, parse_constant=_no_constant)


def _raw_decode_metadata(text: str, at: int) -> tuple[object, int]:
    """``json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_no_constant).raw_decode(text, at)``,
    one Python frame deep as that is (the same recursion limit on a deeply nested object), except that no
    value at ``at`` raises StopIteration, not JSONDecodeError."""
    if _metadata_scan is None:
        import json

        return json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_no_constant).raw_decode(text, at)
    return _metadata_scan(text, at)


def _json_int(text: str) -> int | float:
    return float(text) if text.startswith("-") else int(text)


def read_safetensors(source: ByteSource) -> FileScan:
    length, raw = _framed(source)
    frame = _frame(raw)
    cut = _cut(raw, frame)
    if cut is not None:
        fast = _from_template(cut, source, length)
        if fast is not None:
            return fast
    fast = None if frame is None else _read_compact(raw, source, length, frame)
    if fast is not None:
        if cut is not None:
            _remember(cut, fast)
        return fast
    header, plain = _parse(raw)
    metadata = _metadata(header.pop("__metadata__", None))
    if plain:
        fast = _read_parsed(header, metadata, source, length)
        if fast is not None:
            if cut is not None:
                _remember(cut, fast)
            return fast
    buffer_start = 8 + length
    buffer_len = source.size - buffer_start
    file = source.name
    tensors: list[TensorInfo] = []
    findings: list[Finding] = []
    unknown: dict[str, list[str]] = {}
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct shape: a model repeats a few
    spans: dict[tuple[object, ...], tuple[str | None, tuple[int, ...], int | None]] = {}  # (dtype, *dims) -> checked
    tiled = 0  # where the next tensor must begin if the offsets tile the buffer in header order
    stop = buffer_start  # the previous tensor's absolute end
    for name, entry in header.items():
        if plain:  # equal (dtype, shape) pairs share one check: a model repeats a few shapes many times
            try:
                key = (entry["dtype"], *entry["shape"])
                known = spans.get(key)
                if known is None:
                    known = spans[key] = _span_of(entry["dtype"], entry["shape"])
                dtype, shape, size = known
                begin, end = entry["data_offsets"]
                fits = end - begin == size and 0 <= begin and end < _U64  # ints: the header is plain
            except (TypeError, KeyError, ValueError):
                fits = False
            if fits:
                start = stop if begin == tiled else buffer_start + begin
                stop = buffer_start + end
                tiled = end if begin == tiled else -1
                tensors.append(_new_record(TensorInfo, (name, dtype, shape, file, start, stop, None, None, None)))
                continue
        # The common entry is judged inline (a pre-commit hook pays this per tensor, 4,800 on a
        # pipeline's commit): a known dtype, dims >= 1, an exact span.  It passes exactly what
        # _entry and _span_size pass; anything else (an empty or unknown-dtype tensor, a bad
        # entry) goes through them, for their message or their CG005.
        try:
            dims, (begin, end) = entry["shape"], entry["data_offsets"]
            dtype, bits = _KNOWN[entry["dtype"]]
        except (TypeError, KeyError, ValueError):
            bits = 0
        numel = 0
        if bits and type(dims) is list and type(begin) is int and type(end) is int and 0 <= begin <= end < _U64:
            numel = 1
            for dim in dims:
                if type(dim) is not int or dim < 1:
                    numel = 0
                    break
                numel *= dim  # dims >= 1: the product bounds every partial product (the overflow check)
        total = numel * bits
        if not (numel and total < _U64 and not total % 8 and end - begin == total >> 3):
            dtype, shape, begin, end = _entry(name, entry)
            size = _span_size(name, dtype, shape)
            if size is None:
                unknown.setdefault(dtype, []).append(name)
            elif end - begin != size:
                raise MalformedCheckpoint(
                    f"tensor {shown(name)}: {dtype}{list(shape)} needs {size} bytes but spans {end - begin}"
                )
        else:
            shape = tuple(dims)
            shape = shapes.setdefault(shape, shape)
        # a tensor that starts where the previous one ended shares its int: one object less per tensor
        start = stop if begin == tiled else buffer_start + begin
        stop = buffer_start + end
        tiled = end if begin == tiled else -1
        # stride, storage, storage_offset: safetensors tensors are C-contiguous and share no storage
        tensors.append(_new_record(TensorInfo, (name, dtype, shape, file, start, stop, None, None, None)))
    if tiled != buffer_len:  # out of order, a gap, an overlap or a short buffer: the sorted walk says which
        _check_layout([(t.data_start - buffer_start, t.data_end - buffer_start, t.name) for t in tensors],
                      buffer_len)
    for dtype, names in unknown.items():
        findings.append(make_finding(
            "CG005", source.name,
            f"unknown dtype {dtype!r} on {len(names)} tensor(s), e.g. {shown(names[0])}",
            tensor=names[0],
        ))
    return FileScan(
        path=source.name, format="safetensors", size=source.size,
        tensors=tuple(tensors), findings=tuple(findings), metadata=metadata,
        bytes_read=8 + length,
    )


# The header as the safetensors library writes it (serde_json, compact): ``{"__metadata__":{...},``
# then ``"name":{"dtype":"BF16","shape":[8,4],"data_offsets":[0,64]}`` entries joined by commas.
# One regular expression pass lists its entries as strings, in C; a header in any other form (spaces,
# another key order, escapes in names, zero dims, numbers past 20 digits) goes to the JSON parse.
# Each match starts with its comma (the first, without metadata, with the header's opening brace), so
# matches with nothing between them tile the header: nothing in it was skipped.  Each field is taken up
# to the character that ends it (a dtype to its quote, a shape to its bracket, an offset to its comma or
# bracket): a class of "anything but" costs the engine least (11 % less than digits and word characters
# on a 20-component pipeline's 4,800 entries).  What a field holds is checked after the pattern, as the stricter classes once checked it
# (a word for a dtype, digits and commas for a shape, up to 20 digits for an offset): the dtype and the
# shape once per distinct pair (``_span_of_entry_key``: a known code, digits), the offsets together
# (each end the digits of the sum of the sizes before it: digits, no leading zero).  A shape past 255
# characters or an offset past 20 (never a real tensor's) goes to the JSON parse, which bounds its work
# on a hostile one.
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
_splits: dict[tuple[bool, bool], Callable[[str], list[str]]] = {}  # compiled on first use: a hook may read none


def _compile_split(spaced: bool, offsets_first: bool = False) -> Callable[[str], list[str]]:
    pattern = ((_SPACED_SORTED if spaced else _COMPACT_SORTED) if offsets_first
               else _SPACED if spaced else _COMPACT)
    split = _splits[spaced, offsets_first] = re.compile(pattern, re.ASCII).split
    return split


# how an entry opens in each form: a header without it is in none of them (its first entry is in the head)
_OPENERS = {(False, False): b'":{"dtype":"', (True, False): b'": {"dtype": "',
            (False, True): b'":{"data_offsets":[', (True, True): b'": {"data_offsets": ['}
_OPENER_TEXTS = tuple((opener, opener.decode("ascii")) for opener in _OPENERS.values())
_ASCII_CONTROL = bytes([*range(0x20), 0x7F])  # the ASCII characters str.isprintable turns away
_SPANS: dict[str, tuple[str, tuple[int, ...], int] | None] = {}  # ``BF16","shape":[8,4`` -> (code, shape, bytes)
_SPANS_HELD = 1 << 14  # bounded: a hostile file's distinct shapes
_TILINGS: dict[str, tuple[tuple[int, ...], int]] = {}  # a header's ends as text -> the sizes that spell them, the last end
_TILINGS_HELD, _TILING_CHARS = 256, 8192  # bounded: 256 headers' offsets of up to 8,192 characters (2 MB)
_BYTES = itemgetter(2)


def _read_compact(raw: bytes, source: ByteSource, length: int,
                  frame: tuple[str, dict[str, str], int, int] | None = None) -> FileScan | None:
    """The scan of a header in the library's own compact form, or None for the general parse.

    What this accepts the general parse accepts with the same result: unique names, known dtypes,
    dims >= 1, offsets that tile the buffer (in header order, or sorted) with each span exactly its
    tensor's size.  Anything else (a finding, an error to word) is left to the general parse.
    ``frame``: the header's ``_frame``, where the caller has it.
    """
    head = raw[:4096]
    spaced = b'"dtype":"' not in head
    dtype_at = head.find(b'"dtype": "' if spaced else b'"dtype":"')
    if dtype_at < 0:
        return None  # neither the library's compact form nor json.dumps'
    offsets_first = -1 < head.find(b'"data_offsets"') < dtype_at  # each entry's keys sorted
    if _OPENERS[spaced, offsets_first] not in head:
        return None  # another layout of the entries (indented, say): the pattern would match none of them
    if frame is None:
        frame = _frame(raw)
        if frame is None:
            return None
    text, metadata, start, close = frame
    # split: the text between matches, then each match's five groups, alternating in one flat list (no
    # tuple per entry, no copy of the header); the entries tile the header between its metadata and its
    # closing brace when every text between them is empty and only the first opens with the brace
    parts = (_splits.get((spaced, offsets_first)) or _compile_split(spaced, offsets_first))(text)
    count = len(parts) // 6
    if not count or parts[0] != text[:start] or parts[-1] != text[close:] or any(parts[6:-1:6]):
        return None  # no tensor (the general parse judges an empty header), or something between the entries
    openers = parts[1::6]
    comma = ", " if spaced else ","
    if openers[0] != (comma if start else "{") or openers.count(comma) != count - (not start):
        return None
    names = parts[2::6]
    if not _plain_names(names, "".join(names)):
        return None
    keys = parts[5::6] if offsets_first else parts[3::6]
    spans = _SPANS
    # all(): every span is a non-empty tuple, so a None is the only false item (a truth test per item
    # where ``None in infos`` made a rich comparison of each tuple with None)
    infos = list(map(spans.get, keys))
    if not all(infos):  # a (dtype, shape) this process has not met yet, or one without a span
        fresh = {key: _span_of_entry_key(key, spaced) for key in set(keys).difference(spans)}
        # the file's own spans come from `infos` and `fresh`, never from the cache after it is emptied: a
        # long-lived process (the Hub reviewer) fills it, and a clear between two of a file's keys lost one
        if len(spans) + len(fresh) > _SPANS_HELD:
            spans.clear()
        spans.update(fresh)
        infos = [fresh.get(key) if info is None else info for key, info in zip(keys, infos)]
        if not all(infos):
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
        sizes = tuple(map(_BYTES, infos))
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
        if list(map(sub, ends, begins)) != list(map(_BYTES, infos)) or not _tiles(begins, ends, source.size - buffer_start):
            return None
    # the tensors in columns (guard.tensors.TensorColumns): the names and the spans shared with every header
    # of the same dtype and shape (the offsets follow from them where they are in header order); records are
    # made only for a caller that walks them
    tensors = TensorColumns(names, infos, source.name, buffer_start, begins)
    # positional, all eight fields: the record's fast path (a scan of 4,000 shards builds 4,000 of these)
    return FileScan(source.name, "safetensors", source.size, tensors, (), metadata, 8 + length, ())


def _plain_names(names: list[str], joined: str) -> bool:
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
_METADATA_OPEN = r'\{[ \t\n\r]*"__metadata__"[ \t\n\r]*:[ \t\n\r]*'
_Template = tuple[list[str], str, int, list[tuple[str, tuple[int, ...], int]], "list[int] | None"]
# (entry opener, buffer length) -> templates, latest first: (the text before each name, the last piece, the
# characters before the names, spans, begins or None)
_TEMPLATES: dict[tuple[str, int], list[_Template]] = {}
_MET: dict[tuple[str, int], None] = {}  # (entry opener, buffer length) met once, no template kept yet
_TEMPLATES_HELD, _TEMPLATES_PER_KEY, _TEMPLATE_BYTES = 256, 16, 1 << 19  # 512 KB: a shard's few thousand tensors
_TEMPLATE_CHARS = 1 << 24  # the text all templates hold together (16 M characters): a long-lived process's bound
_held = [0]  # the characters kept since the templates were last emptied
# headers in a row that a key's templates did not read: past _TEMPLATES_PER_KEY (buffers as long, laid out
# otherwise: equal shards cycle through a few layouts, fewer than 16), one template is kept in _RETRY, not one
# per header (the split it costs, a fifth of the read)
_MISSES: dict[tuple[str, int], int] = {}
_RETRY = 64
_cutters: list[tuple[Callable[..., object], Callable[..., object]]] = []  # the two searches, compiled on first use


def _frame(raw: bytes) -> tuple[str, dict[str, str], int, int] | None:
    """A plain header's text, its metadata, where its entries start (after a metadata object that opens it, or at
    its opening brace) and where its closing brace is; None for what the fast readings leave to the general parse:
    escapes, constants, signs, no closing brace before the padding, not UTF-8, metadata not all strings."""
    if b"\\" in raw or _needs_exact_parse(raw):
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
    opened = 16 if text.startswith('{"__metadata__":{') else None  # the library's form: no search
    if opened is None:
        match = _searches()[1](text)
        opened = None if match is None else match.end()  # type: ignore[attr-defined]
    if opened is not None:
        try:
            value, start = _raw_decode_metadata(text, opened)
        except (ValueError, StopIteration, RecursionError):  # StopIteration: no value there ("Expecting value")
            return None
        if type(value) is not dict or not all(type(v) is str for v in value.values()):
            return None
        metadata = value
    return text, metadata, start, close


def _searches() -> tuple[Callable[..., object], Callable[..., object]]:
    if not _cutters:
        _cutters.append((re.compile(_ENTRY_OPEN).search, re.compile(_METADATA_OPEN).match))
    return _cutters[0]


def _cut(raw: bytes, frame: tuple[str, dict[str, str], int, int] | None) -> tuple[str, dict[str, str], int, int,
                                                                                 str] | None:
    """The header's frame and the text that opens each entry (the first one's, from its name's closing quote to
    its first value); None for a header no template could read."""
    if frame is None or len(raw) > _TEMPLATE_BYTES:
        return None
    head = raw[:4096]
    for opener_bytes, opener_text in _OPENER_TEXTS:  # the pattern's forms (the library's first): no search
        if opener_bytes in head:
            return (*frame, opener_text)
    opener = _searches()[0](head)
    return None if opener is None else (*frame, opener.group().decode("ascii"))  # type: ignore[attr-defined]


def _from_template(cut: tuple[str, dict[str, str], int, int, str], source: ByteSource,
                   length: int) -> FileScan | None:
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
        if '"' in joined or not _plain_names(names, joined):
            return None
        _MISSES.pop(key, None)
        tensors = TensorColumns(names, spans, source.name, 8 + length, begins)
        return FileScan(source.name, "safetensors", source.size, tensors, (), metadata, 8 + length, ())
    _MISSES[key] = _MISSES.get(key, 0) + 1
    return None


def _remember(cut: tuple[str, dict[str, str], int, int, str], scan: FileScan) -> None:
    """Keep a header just read in columns as a template, the second time its (form, buffer length) is met."""
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
        if len(_TEMPLATES) >= _TEMPLATES_HELD or _held[0] > _TEMPLATE_CHARS:
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
    leads = list(map(str.__getitem__, pieces, map(slice, map(sub, map(len, pieces), map(len, names)))))
    chars = sum(map(len, leads))
    if _held[0] > _TEMPLATE_CHARS:
        _forget()
        templates = _TEMPLATES[key] = []
    _held[0] += chars + len(pieces[-1]) + 8 * len(leads)  # the text and the list's slots
    templates.insert(0, (leads, pieces[-1], chars, tensors.spans, tensors.begins))
    del templates[_TEMPLATES_PER_KEY:]


def _forget() -> None:
    _TEMPLATES.clear()
    _MISSES.clear()
    _held[0] = 0


_DTYPE_OF, _SHAPE_OF, _OFFSETS_OF = itemgetter("dtype"), itemgetter("shape"), itemgetter("data_offsets")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_PARSED_SPANS: dict[tuple[str, tuple[object, ...]], tuple[str | None, tuple[int, ...], int | None]] = {}


def _read_parsed(header: dict[str, object], metadata: dict[str, str], source: ByteSource,
                 length: int) -> FileScan | None:
    """The scan of a parsed plain header (every number an int) in columns, or None for the entry loop.

    Any valid header, whatever its form (another key order, ``sort_keys``, indentation): each field
    is taken and checked a column at a time, in C.  It accepts what the loop accepts with no finding
    and no error, with the same records: a known dtype with dims >= 1 on each tensor, each span exactly
    its size, the spans tiling the buffer in any order.  Anything else is the loop's to word.
    """
    entries = list(header.values())
    if not entries:
        return None
    # each step raises TypeError or KeyError on what the loop would not pass as it is: an entry that is no
    # object, a missing key, offsets that are not a pair of ints (only ints subtract: the parse is plain, no
    # float, no true or false), an unhashable dtype or dim.  A shape that is no list (a string, an object)
    # gives dims that are strings, which no span passes: the loop words all of these
    try:
        offsets = list(map(_OFFSETS_OF, entries))
        if set(map(len, offsets)) != {2}:
            return None
        begins, ends = list(map(_FIRST, offsets)), list(map(_SECOND, offsets))
        sizes_given = list(map(sub, ends, begins))
        keys = list(zip(map(_DTYPE_OF, entries), map(tuple, map(_SHAPE_OF, entries))))  # hashable, checked once a pair
        infos = list(map(_PARSED_SPANS.get, keys))
    except (TypeError, KeyError):
        return None
    spans = _PARSED_SPANS
    if None in infos:
        fresh = {key: _span_of(key[0], list(key[1])) for key in set(keys).difference(spans)}
        if len(spans) + len(fresh) > _SPANS_HELD:
            spans.clear()
        spans.update(fresh)
        infos = [fresh.get(key) if info is None else info for key, info in zip(keys, infos)]
        if None in infos:
            return None
    if sizes_given != list(map(_BYTES, infos)):  # a size of None: a span the loop judges (an unknown dtype, a zero dim)
        return None
    buffer_start = 8 + length
    if not _tiles(begins, ends, source.size - buffer_start):
        return None
    in_order = begins == [0, *ends[:-1]]
    tensors = TensorColumns(list(header), infos, source.name, buffer_start, None if in_order else begins)
    return FileScan(source.name, "safetensors", source.size, tensors, (), metadata, 8 + length, ())


def _tiles(begins: list[int], ends: list[int], buffer_len: int) -> bool:
    """Whether spans of a byte or more tile the buffer, in any order: the sorted begins are 0 and then the
    sorted ends but the last, which is the buffer's length (the span with the least end is the one at 0,
    the next starts at its end, and so on: no gap, no overlap, nothing past the end)."""
    first_to_last, last_to_first = sorted(begins), sorted(ends)
    return first_to_last[0] == 0 and last_to_first[-1] == buffer_len and first_to_last[1:] == last_to_first[:-1]


_DIM_CHARACTERS = frozenset("0123456789,")  # a shape's text in the compact form: digits and commas
_SPACED_DIM_CHARACTERS = frozenset("0123456789, ")


def _span_of_entry_key(key: str, spaced: bool) -> tuple[str, tuple[int, ...], int] | None:
    """The span of a key the pattern took (a dtype up to its quote, a shape of up to 255 characters up
    to its bracket), or None: a shape of anything but digits, commas (and the spaced form's spaces) goes
    to the JSON parse, as the pattern's digit classes sent it there; an unknown dtype does (``_span_of``)."""
    dims = key.partition('", "shape": [' if spaced else '","shape":[')[2]
    if not (_SPACED_DIM_CHARACTERS if spaced else _DIM_CHARACTERS).issuperset(dims):
        return None
    return _span_of_key(_compact_key(key) if spaced else key)


def _compact_key(key: str) -> str:
    """``BF16", "shape": [8, 4`` as the compact form writes it; other spacing is left to the JSON parse."""
    dtype, _, dims = key.partition('", "shape": [')
    dims = dims.replace(", ", ",")
    return f'{dtype}","shape":[{dims}' if " " not in dims else '","shape":[,'  # the second: no span


def _span_of_key(key: str) -> tuple[str, tuple[int, ...], int] | None:
    dtype, _, dims = key.partition('","shape":[')
    numbers = dims.split(",") if dims else []
    if not all(0 < len(dim) <= 20 and dim[0] != "0" for dim in numbers):
        return None  # an empty dim, a leading zero (not JSON), a zero dim, or past 20 digits: the general parse
    span = _span_of(dtype, [int(dim) for dim in numbers])
    return None if span is _NO_SPAN else span  # type: ignore[return-value]


_NO_SPAN: tuple[None, tuple[int, ...], None] = (None, (), None)  # a size no pair of offsets equals


def _span_of(dtype: object, dims: object) -> tuple[str | None, tuple[int, ...], int | None]:
    """(code, shape, bytes) of a known dtype with dims >= 1 in whole bytes, as the inline check in
    ``read_safetensors`` passes them; ``_NO_SPAN`` for anything else (it goes through that check)."""
    known = _KNOWN.get(dtype) if type(dtype) is str else None
    if known is None or type(dims) is not list:
        return _NO_SPAN
    numel = 1
    for dim in dims:
        if type(dim) is not int or dim < 1:
            return _NO_SPAN
        numel *= dim
    total = numel * known[1]
    if total >= _U64 or total % 8:
        return _NO_SPAN
    return known[0], tuple(dims), total >> 3


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise MalformedCheckpoint("__metadata__ must map strings to strings")
    return value


def _entry(name: str, entry: object) -> tuple[str, tuple[int, ...], int, int]:
    if type(entry) is not dict:
        raise MalformedCheckpoint(f"tensor {shown(name)}: entry is not an object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if type(dtype) is not str:
        raise MalformedCheckpoint(f"tensor {shown(name)}: missing or non-string dtype")
    if type(shape) is not list or not _all_uints(shape):
        raise MalformedCheckpoint(f"tensor {shown(name)}: shape must be a list of non-negative integers")
    if type(offsets) is not list or len(offsets) != 2 or not _all_uints(offsets) or offsets[0] > offsets[1]:
        raise MalformedCheckpoint(f"tensor {shown(name)}: data_offsets must be [begin, end] with begin <= end")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _span_size(name: str, dtype: str, shape: tuple[int, ...]) -> int | None:
    """Bytes the tensor needs, with the reference's checks: no u64 overflow, whole bytes only."""
    numel = 1
    for dim in shape:  # stepwise, as Rust's checked_mul: also bounds the work on a hostile shape
        numel *= dim
        if numel >= 2**64:
            raise MalformedCheckpoint(f"tensor {shown(name)}: shape {list(shape)[:8]} overflows a 64-bit size")
    if dtype not in dtypes.DTYPES:
        return None
    total = numel * dtypes.DTYPES[dtype].bits
    if total >= 2**64:
        raise MalformedCheckpoint(f"tensor {shown(name)}: {dtype}{list(shape)[:8]} overflows a 64-bit size")
    if total % 8:
        raise MalformedCheckpoint(f"tensor {shown(name)}: {dtype}{list(shape)} does not fill whole bytes")
    return total // 8


def _all_uints(values: list[object]) -> bool:
    """Every value a JSON integer in [0, 2^64) (``type is int``: never a bool or a float)."""
    for value in values:
        if type(value) is not int or not 0 <= value < _U64:  # type: ignore[operator]
            return False
    return True


_U64 = 2**64


def _check_layout(spans: list[tuple[int, int, str]], buffer_len: int) -> None:
    """Offsets must tile the data buffer exactly: contiguous, non-overlapping, fully covered."""
    expected = 0
    for begin, end, name in sorted(spans):
        if begin != expected:
            kind = "overlaps the previous tensor" if begin < expected else "leaves a gap before it"
            raise MalformedCheckpoint(f"invalid offset: tensor {shown(name)} {kind}")
        expected = end
    if expected != buffer_len:
        if expected > buffer_len:
            raise MalformedCheckpoint(
                f"tensor data runs past the end of the file ({expected:,} > {buffer_len:,} bytes): truncated?"
            )
        raise MalformedCheckpoint(f"file not fully covered: {buffer_len - expected:,} trailing bytes")
