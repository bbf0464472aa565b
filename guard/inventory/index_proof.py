"""A shard index proven equal to its shards' headers, without parsing its ``weight_map``.

A 4,000-shard index maps 200,000 tensor names to their shards: 16 MB of JSON whose parse
(``json.loads``: two strings per tensor and a 200,000-entry dict, ~60 MB at its peak) costs more
than reading the 4,000 headers it describes, and checking it against them (CG004) walks it again.
Yet the index that ``save_pretrained`` writes is a function of those headers: every tensor name
in sorted order, each mapped to the file holding it, written by ``json.dumps(indent=N)``.

So the index is written again from the headers and compared byte for byte, in chunks, with no
string made per tensor beyond the chunk in hand.  Equal bytes prove everything the parse and
CG004's check would establish:

* the ``weight_map`` is the one in the document (``"weight_map"`` occurs nowhere else, and the rest
  of the document, with the map emptied, parses as JSON with that key at its top level);
* its keys are the tensors of the set's shards, each once (the names, sorted, strictly increase),
  and each maps to the shard holding it: no missing, extra, misplaced or duplicate tensor, no
  shard listed that is not there, no shard left out;
* its strings decode to exactly those names (none holds a quote, a backslash or a control
  character; a ``\\u`` escape, which ``json.dumps``' default ``ensure_ascii`` writes for a
  non-ASCII name, differs from the name's own bytes and so is left to the parse).

Anything else (another layout, unsorted keys, a name with an escape, a shard that did not read,
a single disagreeing byte) proves nothing, and the index is parsed and checked as before: this
is a shortcut for the index that is right, never a second judge of one that is wrong.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from operator import itemgetter, lt

from guard import jsonload
from guard.errors import MalformedCheckpoint
from guard.inventory.sets import BY_NAME
from guard.sources import ByteSource
from guard.tensors import TENSOR_FILE, TENSOR_NAME, FileScan, column

# the map's opening line and the first entry's indentation (json.dumps(indent=N) puts each on its own line)
_OPENER = re.compile(rb'\n( *)"weight_map": \{\n( +)"')
_CHUNK = 8192  # entries written and compared at a time: ~0.7 MB of text
_HEAD = 1 << 16  # the document before the map (its metadata), and after it: a few lines each


def prove_index(source: ByteSource, scans: Sequence[FileScan], memo: dict[object, object] | None = None) -> bool:
    """Whether ``source`` is a valid JSON index whose ``weight_map`` is exactly the tensors of ``scans``.

    Read a chunk at a time: a local index is compared from the file, never held whole.  ``memo``: the set's
    (``WeightSet.memo``), where the names' order worked out on the way is kept as ``BY_NAME`` for the
    loading check, which needs the same order (``guard.rules.loading``)."""
    try:
        return _proven(source, scans, memo)
    except (OSError, MalformedCheckpoint):  # unreadable, or changed while read: the parse says what it says
        return False


def _proven(source: ByteSource, scans: Sequence[FileScan], memo: dict[object, object] | None) -> bool:
    head = source.read_at(0, min(source.size, _HEAD)) if scans else b""
    opener = _OPENER.search(head)
    if opener is None:
        return False  # no map, another layout, or metadata longer than the head: the parse
    bases = {scan.path: posixpath.basename(scan.path) for scan in scans}
    if len(set(bases.values())) != len(scans) or not _plain("".join(bases.values())):
        return False  # two shards of one name (in two folders): an index's file names cannot tell them apart
    if any(scan.format is None or not scan.tensors for scan in scans):
        return False  # unreadable (CG001) or empty: the parse and CG004 say what is wrong
    # Entry i is ``indent"name_i": "file_i"``; the text between two names, ``": "file",\n indent"``,
    # depends on the shard alone: the document's entries are the names and those links, alternating.
    indent = opener.group(2).decode("ascii")
    link = {path: f'": "{base}",\n{indent}"' for path, base in bases.items()}
    # the names and each one's link, read from the files' columns (no record is made), put in the names'
    # order by sorting their positions: no dict of 200,000 fresh names to hash, only comparisons of them
    names = list(chain.from_iterable(column(TENSOR_NAME, scan.tensors) for scan in scans))
    links = list(map(link.__getitem__, chain.from_iterable(column(TENSOR_FILE, scan.tensors) for scan in scans)))
    order = sorted(range(len(names)), key=names.__getitem__)
    names = list(map(names.__getitem__, order))
    if memo is not None:
        memo[BY_NAME] = (names, order)
    if not all(map(lt, names, names[1:])):
        return False  # a name twice (in two shards): the index could hold it only once
    start = at = opener.start(2)
    lead = indent + '"'
    entries: list[str] = []
    for first in range(0, len(names), _CHUNK):
        chunk_names = names[first:first + _CHUNK]
        if not _plain("".join(chunk_names)):
            return False
        if len(entries) != 2 * len(chunk_names):
            entries = [""] * (2 * len(chunk_names))
        entries[0::2] = chunk_names  # names and links alternating, put in place in C
        entries[1::2] = map(links.__getitem__, order[first:first + _CHUNK])
        text = lead + "".join(entries)
        lead = ""
        if first + _CHUNK >= len(names):  # the last entry closes with its quote alone
            text = text[:len(text) - len(indent) - 3]
        data = text.encode("utf-8")
        if at + len(data) > source.size or source.read_at(at, len(data)) != data:
            return False
        at += len(data)
    if source.size - at > _HEAD:
        return False
    tail = source.read_at(at, source.size - at)
    if not tail.startswith(b"\n" + opener.group(1) + b"}"):
        return False
    rest = head[:start] + tail
    if rest.count(b'"weight_map"') != 1:
        return False  # the map's key again, outside it: which one a parse keeps is not this one to say
    try:  # the rest of the document, the map emptied: one top-level object holding it
        document = jsonload.parse(rest, "index")  # json.loads' value, or a ValueError
    except ValueError:
        return False
    return type(document) is dict and document.get("weight_map") == {}


def _plain(text: str) -> bool:
    """No quote, backslash or control character: the text is its own JSON string body."""
    return '"' not in text and "\\" not in text and text.isprintable()


class HeaderMap(Mapping[str, str]):
    """A proven index's ``weight_map``, built from its shards' headers when first asked for.

    Equal, key order included, to what parsing the index would give: the proof compared the
    document with these entries in this order.  Its length is known without building it.
    """

    def __init__(self, scans: Sequence[FileScan]) -> None:
        self._scans = tuple(scans)
        self._length = sum(len(scan.tensors) for scan in self._scans)
        self._map: dict[str, str] | None = None

    def _built(self) -> dict[str, str]:
        if self._map is None:
            pairs = [(t.name, posixpath.basename(scan.path)) for scan in self._scans for t in scan.tensors]
            pairs.sort(key=itemgetter(0))
            self._map = dict(pairs)
        return self._map

    def __getitem__(self, key: str) -> str:
        return self._built()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return self._length

    def __contains__(self, key: object) -> bool:
        return key in self._built()

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]  # a read-only view's get, narrower than dict's
        return self._built().get(key, default)

    def keys(self):
        return self._built().keys()

    def values(self):
        return self._built().values()

    def items(self):
        return self._built().items()

    def __eq__(self, other: object) -> bool:
        return self._built() == other if isinstance(other, Mapping) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # unhashable, as a dict is

    def __repr__(self) -> str:
        return f"HeaderMap({len(self)} tensors in {len(self._scans)} shard(s))"
