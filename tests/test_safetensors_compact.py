"""The compact-header reading agrees with the general JSON parse on every header, valid or not.

The safetensors library writes its header compact (``{"__metadata__":{...},"name":{"dtype":...}}``),
and the reader lists such a header's entries with one regular-expression pass instead of
json.loads.  Headers written by the library itself are read that way; a mutated header (a byte
inserted, dropped or replaced: a quote, a brace, a digit, a space, an escape, a control
character) must get exactly what the general parse gives: the same tensors, the same findings,
or the same one-line error.
"""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest
from safetensors.numpy import save

from guard.errors import MalformedCheckpoint
from guard.readers import safetensors as reader
from guard.readers.safetensors import pattern, reference
from guard.sources import BytesSource
from guard.tensors import TensorColumns

_PIECES = [*'",:{}[] \n\tab0159\\-', '"dtype":"F32"', '"shape":[', '"data_offsets":[', "é", "\x01", "NaN", "-0"]


def _written() -> list[bytes]:
    return [
        save({"model.embed.weight": np.zeros((2, 3), np.float32), "model.norm.weight": np.zeros((4,), np.float16),
              "lm_head.bias": np.zeros((1, 1), np.uint8)}, metadata={"format": "pt"}),
        save({"x": np.zeros((2,), np.float32), "y}z": np.zeros((3,), np.float32)}),
        save({}, metadata={"0": ""}),  # no tensor at all: the general parse's, a file of metadata only
    ]


def _mutated(rng: random.Random, header: str, edits: int) -> str:
    """``edits`` seeded edits of a header's text: a piece inserted, a character dropped or replaced."""
    text = list(header)
    for _ in range(edits):
        at = rng.randrange(len(text) + 1)
        roll = rng.random()
        if roll < 0.4:
            text.insert(at, rng.choice(_PIECES))
        elif text:
            text[min(at, len(text) - 1):min(at, len(text) - 1) + 1] = [] if roll < 0.8 else [rng.choice(_PIECES)]
    return "".join(text)


def _read(data: bytes, *, compact: bool, monkeypatch: pytest.MonkeyPatch) -> object:
    # compact=False: the reference alone (no template, no pattern, no parsed header's columns)
    read = reader.read_safetensors if compact else reference.read_safetensors
    try:
        return read(BytesSource(data, name="model.safetensors"))
    except MalformedCheckpoint as exc:
        return f"error: {exc}"


def test_a_header_of_metadata_alone_is_read_as_no_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _written()[-1]
    scan = _read(data, compact=True, monkeypatch=monkeypatch)
    assert scan == _read(data, compact=False, monkeypatch=monkeypatch)
    assert scan.format == "safetensors" and scan.tensors == () and scan.findings == ()  # type: ignore[union-attr]


def test_library_headers_take_the_compact_reading() -> None:
    for data in _written()[:-1]:
        (length,) = struct.unpack("<Q", data[:8])
        source = BytesSource(data, name="model.safetensors")
        scan = pattern.read_compact(data[8:8 + length], source, length)
        assert scan is not None and scan.tensors
        assert scan == reader.read_safetensors(source)


def test_mutated_headers_agree_with_the_json_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(20261205)
    accepted = 0
    for _ in range(3000):
        data = rng.choice(_written())
        (length,) = struct.unpack("<Q", data[:8])
        body = data[8 + length:]
        header = _mutated(rng, data[8:8 + length].decode(), rng.randint(1, 3)).encode()
        if rng.random() < 0.5:
            header += b" " * (-len(header) % 8)
        size = max(len(body) + rng.choice([0, 0, 0, -1, 1, 4]), 0)
        mutated = struct.pack("<Q", len(header)) + header + (body + bytes(8))[:size]
        compact = _read(mutated, compact=True, monkeypatch=monkeypatch)
        assert compact == _read(mutated, compact=False, monkeypatch=monkeypatch), header
        accepted += pattern.read_compact(header, BytesSource(mutated), len(header)) is not None
    assert accepted > 10  # renamed tensors and the like still take the compact reading


def _reformed(rng: random.Random) -> str:
    """A library-written header written again in another valid form: ``sort_keys``, indented, each entry's
    keys in a random order, the tensors listed out of the buffer's order, an extra key in an entry."""
    data = rng.choice(_written()[:2])
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    entries = list(header.items())
    rng.shuffle(entries)
    entries = [(name, dict(rng.sample(sorted(entry.items()), len(entry))) if isinstance(entry, dict) else entry)
               for name, entry in entries]
    if rng.random() < 0.2:
        entries[-1][1]["note"] = [1, 2]  # a key the reference ignores
    form = rng.choice(["sort_keys", "sort_keys compact", "indent", "compact", "shuffled"])
    if form.startswith("sort_keys"):
        return json.dumps(dict(entries), sort_keys=True, separators=(",", ":") if form.endswith("compact") else None)
    return json.dumps(dict(entries), indent=2 if form == "indent" else None,
                      separators=(",", ":") if form == "compact" else None)


def test_headers_of_any_form_read_in_columns_agree_with_the_entry_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parsed header's columns (``_read_parsed``) against the entry loop, on valid headers of other forms
    and on their mutations: the same tensors, findings or one-line error."""
    rng = random.Random(20261206)
    columns = sorted_form = 0
    first = _written()[0]
    body = first[8 + struct.unpack("<Q", first[:8])[0]:]
    for round_ in range(3000):
        text = _reformed(rng)
        header = _mutated(rng, text, rng.randint(0, 2) if round_ % 4 else 0).encode()
        header += b" " * (-len(header) % 8)
        for size in {len(body), 16}:  # the first file's buffer, or the second's (2 + 3 floats, 20 bytes: short)
            mutated = struct.pack("<Q", len(header)) + header + (body + bytes(24))[:size]
            result = _read(mutated, compact=True, monkeypatch=monkeypatch)
            assert result == _read(mutated, compact=False, monkeypatch=monkeypatch), header
            columns += not isinstance(result, str) and type(result.tensors) is TensorColumns  # type: ignore[attr-defined]
            sorted_form += pattern.read_compact(header, BytesSource(mutated), len(header)) is not None and \
                b'{"data_offsets"' in header.replace(b" ", b"")
    assert columns > 300  # valid headers of every form take the columns
    assert sorted_form > 100  # ``sort_keys`` headers, out of the buffer's order, by the pattern


@pytest.mark.parametrize("joint", ["}{", "},{{", "}}{", "}{,", "} ,", "}, "])
def test_entries_must_be_joined_by_commas(joint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the first entry opens with the header's brace; any other joint is the general parse's to judge."""
    for data in _written()[:2]:
        (length,) = struct.unpack("<Q", data[:8])
        header = data[8:8 + length].rstrip(b" ").replace(b'},"', joint.encode() + b'"', 1)
        header += b" " * (-len(header) % 8)
        mutated = struct.pack("<Q", len(header)) + header + data[8 + length:]
        assert pattern.read_compact(header, BytesSource(mutated), len(header)) is None
        result = _read(mutated, compact=True, monkeypatch=monkeypatch)
        assert result == _read(mutated, compact=False, monkeypatch=monkeypatch)
        if joint.replace(" ", "") == "},":  # a space is still JSON: read by the general parse, with the same tensors
            assert not isinstance(result, str) and len(result.tensors) == len(reader.read_safetensors(  # type: ignore[attr-defined]
                BytesSource(data, name="model.safetensors")).tensors)
        else:
            assert isinstance(result, str) and result.startswith("error: header is not valid JSON")


@pytest.mark.parametrize("old, new", [
    ('"shape":[2,3]', '"shape":[02,3]'), ('"shape":[2,3]', '"shape":[2,,3]'), ('"shape":[2,3]', '"shape":[2,3,]'),
    ('"shape":[2,3]', '"shape":[,2,3]'), ('"shape":[2,3]', '"shape":[2,0,3]'), ('"shape":[2,3]', '"shape":[0]'),
    ('"shape":[2,3]', '"shape":[2,3,1]'), ('"shape":[2,3]', '"shape":[6]'),
    ('"shape":[2,3]', '"shape":[' + ",".join(["1"] * 120) + ',2,3]'),  # past the pattern's 255 characters
    ('"shape":[2,3]', '"shape":[2,000000000000000000003]'), ('"shape":[2,3]', '"shape":[2,' + "9" * 21 + "]"),
    ('"data_offsets":[0,24]', '"data_offsets":[00,24]'), ('"data_offsets":[0,24]', '"data_offsets":[0,024]'),
    ('"data_offsets":[0,24]', '"data_offsets":[0,' + "0" * 19 + '24]'),
    ('"data_offsets":[0,24]', '"data_offsets":[0,24.0]'),
])
def test_numbers_in_json_form_only(old: str, new: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pattern takes any digits; what is not JSON (or not the library's form) goes to the general parse."""
    data = _written()[0]
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + length].rstrip(b" ")
    assert old.encode() in header
    header = header.replace(old.encode(), new.encode(), 1)
    header += b" " * (-len(header) % 8)
    mutated = struct.pack("<Q", len(header)) + header + data[8 + length:]
    compact = pattern.read_compact(header, BytesSource(mutated, name="model.safetensors"), len(header))
    general = _read(mutated, compact=False, monkeypatch=monkeypatch)
    assert _read(mutated, compact=True, monkeypatch=monkeypatch) == general
    if compact is not None:  # taken by the pattern: exactly what the general parse reads
        assert compact == general


# ---------------------------------------------------------------- json.dumps' form: ", " and ": "


def _spaced(data: bytes) -> bytes:
    """The same file with its header written again by ``json.dumps`` (default separators), as
    hand-rolled writers write it: the entries' order and the tensor bytes unchanged."""
    import json

    (length,) = struct.unpack("<Q", data[:8])
    header = json.dumps(json.loads(data[8:8 + length])).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data[8 + length:]


def test_json_dumps_headers_take_the_fast_reading() -> None:
    for data in map(_spaced, _written()[:-1]):
        assert b'": {"dtype": "' in data
        (length,) = struct.unpack("<Q", data[:8])
        source = BytesSource(data, name="model.safetensors")
        scan = pattern.read_compact(data[8:8 + length], source, length)
        assert scan is not None and scan.tensors
        assert scan == reader.read_safetensors(source)


def test_mutated_json_dumps_headers_agree_with_the_json_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(20261206)
    accepted = 0
    bases = [_spaced(data) for data in _written()]
    for _ in range(3000):
        data = rng.choice(bases)
        (length,) = struct.unpack("<Q", data[:8])
        text, body = list(data[8:8 + length].decode().rstrip(" ")), data[8 + length:]
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text) + 1)
            roll = rng.random()
            if roll < 0.4:
                text.insert(at, rng.choice([*_PIECES, ", ", ": ", '"dtype": "F32"', '"shape": [', "  "]))
            elif text:
                text[min(at, len(text) - 1):min(at, len(text) - 1) + 1] = [] if roll < 0.8 else [rng.choice(_PIECES)]
        header = "".join(text).encode()
        if rng.random() < 0.5:
            header += b" " * (-len(header) % 8)
        size = max(len(body) + rng.choice([0, 0, 0, -1, 1, 4]), 0)
        mutated = struct.pack("<Q", len(header)) + header + (body + bytes(8))[:size]
        assert _read(mutated, compact=True, monkeypatch=monkeypatch) == _read(mutated, compact=False,
                                                                              monkeypatch=monkeypatch), header
        accepted += pattern.read_compact(header, BytesSource(mutated), len(header)) is not None
    assert accepted > 10


@pytest.mark.parametrize("old, new", [
    ('"shape": [2, 3]', '"shape": [02, 3]'), ('"shape": [2, 3]', '"shape": [2,  3]'),
    ('"shape": [2, 3]', '"shape": [2 , 3]'), ('"shape": [2, 3]', '"shape": [2,3]'),
    ('"shape": [2, 3]', '"shape": [2, 3, ]'), ('"shape": [2, 3]', '"shape": [ 2, 3]'),
    ('"shape": [2, 3]', '"shape": [2 3]'), ('"shape": [2, 3]', '"shape": [2, 0, 3]'),
    ('"shape": [2, 3]', '"shape": [6]'), ('"data_offsets": [0, 24]', '"data_offsets": [0,24]'),
    ('"data_offsets": [0, 24]', '"data_offsets": [0, 024]'), ('"dtype": "F32"', '"dtype":  "F32"'),
])
def test_json_dumps_numbers_and_spacing(old: str, new: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other spacing is still JSON: the general parse reads it, and the fast reading agrees or steps aside."""
    data = _spaced(_written()[0])
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + length].rstrip(b" ")
    assert old.encode() in header
    header = header.replace(old.encode(), new.encode(), 1)
    header += b" " * (-len(header) % 8)
    mutated = struct.pack("<Q", len(header)) + header + data[8 + length:]
    fast = pattern.read_compact(header, BytesSource(mutated, name="model.safetensors"), len(header))
    general = _read(mutated, compact=False, monkeypatch=monkeypatch)
    assert _read(mutated, compact=True, monkeypatch=monkeypatch) == general
    if fast is not None:
        assert fast == general


def test_a_full_span_cache_loses_none_of_a_files_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process-wide span cache is emptied when full.  A file whose (dtype, shape) keys are partly cached
    and partly new, read as the cache fills, keeps all its spans: the same scan as with room to spare (the
    cache was once emptied between two of a file's keys, and the lookup of the first one failed: CG001)."""
    data = _written()[0]
    expected = _read(data, compact=False, monkeypatch=monkeypatch)
    for held in range(1, 5):
        monkeypatch.setattr(pattern, "_SPANS", {})
        monkeypatch.setattr(pattern, "_SPANS_HELD", held)
        pattern.read_compact(*_parts(_written()[1]))  # one of the cache's keys beside the file's
        source = BytesSource(data, name="model.safetensors")
        assert pattern.read_compact(*_parts(data)) == expected == reader.read_safetensors(source)
        assert len(pattern._SPANS) <= max(held, 3)


def _parts(data: bytes) -> tuple[bytes, BytesSource, int]:
    (length,) = struct.unpack("<Q", data[:8])
    return data[8:8 + length], BytesSource(data, name="model.safetensors"), length


@pytest.mark.parametrize("spelling", ["08", "008", "8", "+8", " 8", "8 ", "8_0", "٨", "0", "00", "8.0", "1e1"])
def test_offsets_out_of_the_buffers_order_in_json_spelling_only(spelling: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``sort_keys`` header whose tensors are listed out of the buffer's order: the pattern takes the offsets as
    text; only JSON's own spelling of each (ASCII digits, no leading zero) is read by it, as the parse reads it."""
    entries = {"b": {"data_offsets": [0, 8], "dtype": "F32", "shape": [2]},
               "a": {"data_offsets": [8, 20], "dtype": "F32", "shape": [3]}}  # "a" first in the text, second in bytes
    header = json.dumps(entries, sort_keys=True, separators=(",", ":")).replace('"data_offsets":[8,',
                                                                               f'"data_offsets":[{spelling},')
    raw = header.encode()
    raw += b" " * (-len(raw) % 8)
    data = struct.pack("<Q", len(raw)) + raw + bytes(20)
    compact = pattern.read_compact(raw, BytesSource(data, name="model.safetensors"), len(raw))
    general = _read(data, compact=False, monkeypatch=monkeypatch)
    assert _read(data, compact=True, monkeypatch=monkeypatch) == general
    if spelling == "8":
        assert compact is not None and compact == general and type(compact.tensors) is TensorColumns
        assert [(t.name, t.data_start - 8 - len(raw), t.data_end - 8 - len(raw)) for t in compact.tensors] == [
            ("a", 8, 20), ("b", 0, 8)]
    else:
        assert compact is None or compact == general


def test_a_known_tiling_is_checked_against_this_headers_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ends' text of a header read before (a shard's twin) is looked up, not worked out again: a header with
    the same offsets and another size for a tensor must still be refused as the parse refuses it."""
    data = _written()[0]
    (length,) = struct.unpack("<Q", data[:8])
    first = reader.read_safetensors(BytesSource(data, name="model.safetensors"))  # its tiling is now known
    assert type(first.tensors) is TensorColumns
    header = data[8:8 + length].replace(b'"shape":[2,3]', b'"shape":[2,4]', 1)  # 32 bytes, still spanning 24
    mutated = struct.pack("<Q", len(header)) + header + data[8 + length:]
    assert pattern.read_compact(header, BytesSource(mutated, name="model.safetensors"), len(header)) is None
    result = _read(mutated, compact=True, monkeypatch=monkeypatch)
    assert result == _read(mutated, compact=False, monkeypatch=monkeypatch)
    assert isinstance(result, str) and "needs 32 bytes but spans 24" in result
