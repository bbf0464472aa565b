"""Shards of one layout read from a template: the same scan as the entry loop, for every header.

A model's shards repeat a layout (the same dtypes, shapes and offsets under other layers' names).
Once a header is read in columns, its text between the names is kept; a later header that is that
text with other names is read with one split.  Whatever a header holds, the scan must be exactly the
entry loop's: the same tensors, the same findings or the same one-line error.  The template may only
ever be a shortcut for a header that is right.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from guard.errors import MalformedCheckpoint
from guard.readers import safetensors as reader
from guard.readers.safetensors import fast, pattern, reference, templates as templates_module
from guard.sources import BytesSource, LocalFile
from guard.tensors import TensorColumns

_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj", "input_layernorm")


@pytest.fixture(autouse=True)
def _fresh_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templates_module, "_TEMPLATES", {})
    monkeypatch.setattr(templates_module, "_MET", {})
    monkeypatch.setattr(templates_module, "_MISSES", {})
    monkeypatch.setattr(templates_module, "_held", 0)


def _layer(index: int, **kwargs: object) -> bytes:
    """One shard of a model in layers, as the safetensors library writes it: the same layout for every layer."""
    tensors = {f"model.layers.{index}.{part}.weight": np.zeros((4,) if "norm" in part else (4, 2 + i), np.float16)
               for i, part in enumerate(_PARTS)}
    return save(tensors, metadata={"format": "pt"}, **kwargs)  # type: ignore[arg-type]


def _loop(data: bytes, monkeypatch: pytest.MonkeyPatch) -> object:
    try:  # the reference alone: no template, no pattern, no columns
        return reference.read_safetensors(BytesSource(data, name="model.safetensors"))
    except MalformedCheckpoint as exc:
        return f"error: {exc}"


def _read(data: bytes) -> object:
    try:
        return reader.read_safetensors(BytesSource(data, name="model.safetensors"))
    except MalformedCheckpoint as exc:
        return f"error: {exc}"


def _hits(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each read from now on was answered by a template."""
    taken: list[bool] = []
    real = fast.from_template

    def counted(*args: object) -> object:
        scan = real(*args)  # type: ignore[arg-type]
        taken.append(scan is not None)
        return scan

    monkeypatch.setattr(fast, "from_template", counted)
    return taken


def _with_header(data: bytes, header: bytes, buffer: int | None = None) -> bytes:
    (length,) = struct.unpack("<Q", data[:8])
    body = data[8 + length:]
    body = body if buffer is None else (body + bytes(8))[:buffer]
    return struct.pack("<Q", len(header)) + header + body


def _header(data: bytes) -> str:
    (length,) = struct.unpack("<Q", data[:8])
    return data[8:8 + length].decode()


def test_a_template_is_kept_the_second_time_a_layout_is_met_and_read_from_the_third(
        monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _hits(monkeypatch)
    scans = [_read(_layer(i)) for i in range(5)]
    assert taken == [False, False, True, True, True]  # met, kept, then read from it
    for i, scan in enumerate(scans):
        assert scan == _loop(_layer(i), monkeypatch)
        assert type(scan.tensors) is TensorColumns  # type: ignore[attr-defined]
        assert [t.name for t in scan.tensors][0] == f"model.layers.{i}.input_layernorm.weight"  # type: ignore[attr-defined]
    assert [(t.dtype, t.shape, t.data_start, t.data_end) for t in scans[4].tensors] == \
        [(t.dtype, t.shape, t.data_start, t.data_end) for t in scans[1].tensors]  # type: ignore[attr-defined]


def test_sharded_llama_written_by_save_pretrained_reads_its_repeated_shards_from_a_template(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' shards of one layer each share a layout: read from a template, each scan is the entry
    loop's, and the JSON report of the model is the same byte for byte."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from guard.cli import main

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=6,
                                      num_attention_heads=2, num_key_value_heads=2, dtype="float32")
    torch.manual_seed(0)
    directory = tmp_path / "llama"
    transformers.LlamaForCausalLM(config).save_pretrained(directory, max_shard_size="12KB")
    shards = sorted(directory.glob("*.safetensors"))
    assert len(shards) >= 6
    taken = _hits(monkeypatch)
    for shard in shards:
        data = shard.read_bytes()
        scan = reader.read_safetensors(LocalFile(shard, name=shard.name))
        assert type(scan.tensors) is TensorColumns and len(data) == scan.size
        with monkeypatch.context() as patch:
            patch.setattr(reader, "read_fast", lambda *_: None)  # the reference alone
            assert scan == reader.read_safetensors(LocalFile(shard, name=shard.name))
    assert sum(taken) >= 3  # the layers' shards after the first two of their layout

    def report(name: str, *, templates: bool) -> str:
        with monkeypatch.context() as patch:
            for cache in ("_TEMPLATES", "_MET", "_MISSES"):
                patch.setattr(templates_module, cache, {})
            if not templates:
                patch.setattr(reader, "read_fast", lambda *_: None)  # the reference alone
            main(["scan", "--expect", "config", "--format", "json", "-o", str(tmp_path / name), str(directory)])
        return (tmp_path / name).read_text(encoding="utf-8")

    assert report("templates.json", templates=True) == report("loop.json", templates=False)


_NAME = "model.layers.2.self_attn.k_proj.weight"


@pytest.mark.parametrize("old, new", [
    (_NAME, "model.layers.2.self_attn.k_proj.weigh"),  # a plain rename: still the template's
    (_NAME, "model.layers.2.self_attn.q_proj.weight"),  # a name twice
    (_NAME, "__metadata__"),  # a second metadata key
    (_NAME, "model.layers.2.\x01"),  # a control character: not JSON
    (_NAME, "model.layers.2.\x7f"),  # DEL: JSON, not printable
    (_NAME, "model.layers.2.\u200b"),  # a non-printing code point: JSON
    (_NAME, "model.layers.2.é"),
    (_NAME, 'model.layers.2.\\"'),  # an escaped quote
    (_NAME, ""),  # the empty name: JSON
    ('"F16"', '"F32"'), ('"F16"', '"BF16"'), ('"F16"', '"I16"'), ('"F16"', '"X16"'),
    ("[4,3]", "[3,4]"), ("[4,3]", "[12]"), ("[4,3]", "[4, 3]"), ("[4,3]", "[4,03]"),
    ('"data_offsets":[0,', '"data_offsets":[1,'), (",40]", ",41]"), (",40]", ",040]"),
    ('"format":"pt"', '"format":"np"'), ('{"__metadata__":{"format":"pt"},', "{"),
    ('"format":"pt"', '"format":"pt","format":"pt"'), ('"format":"pt"', '"format":1'),
    ('"format":"pt"}', '"format":"pt"} '), ("}}", "}} }"), ("}}", "}},"), ("}}", "} }"),
    (':{"dtype"', ': {"dtype"'), (',"shape"', ',"note":1,"shape"'), ('"model.', '"model.'),
])
@pytest.mark.parametrize("buffer", [None, -1, 1])
def test_a_header_one_difference_from_a_template_is_read_as_the_entry_loop_reads_it(
        old: str, new: str, buffer: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(2):
        _read(_layer(i))  # the layout met and kept
    data = _layer(2)
    header = _header(data).rstrip(" ")
    at = header.rfind(old) if old == "}}" else header.find(old)  # '"model.' for '"model.': the layer as written
    assert at >= 0
    header = header[:at] + new + header[at + len(old):]
    raw = header.encode()
    raw += b" " * (-len(raw) % 8)
    size = None if buffer is None else len(data) - 8 - struct.unpack("<Q", data[:8])[0] + buffer
    planted = _with_header(data, raw, size)
    taken = _hits(monkeypatch)
    assert _read(planted) == _loop(planted, monkeypatch), header
    if buffer is None and (old == '"model.' or new.endswith("weigh")):
        assert taken == [True]  # a right header takes the template


def test_mutated_headers_agree_with_the_entry_loop_once_their_layout_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded edits of a header whose layout has a template: in its names most of the time (the edits a template
    must judge), anywhere in it otherwise; each with the right buffer, or one a byte short or long."""
    rng = random.Random(20261207)
    pieces = [*'",:{}[] \n\tab0159\\-', "é", "\x01", "\x7f", "\u200b", "__metadata__", '":{"dtype":"F16","shape":[4',
              "model.layers.2.self_attn.q_proj.weight"]
    for i in range(2):
        _read(_layer(i))
    data = _layer(3)
    base = _header(data).rstrip(" ")
    names = [name for name in json.loads(base) if name != "__metadata__"]
    taken = _hits(monkeypatch)
    for round_ in range(3000):
        header = base
        for _ in range(rng.randint(1, 2)):
            if round_ % 3:  # in a name: an edit at a point of one of them
                name = rng.choice(names)
                at = header.find(f'"{name}"') + 1 + rng.randrange(len(name) + 1)
            else:
                at = rng.randrange(len(header) + 1)
            roll = rng.random()
            if roll < 0.5:
                header = header[:at] + rng.choice(pieces) + header[at:]
            else:
                header = header[:at] + ("" if roll < 0.75 else rng.choice(pieces)) + header[at + 1:]
        raw = header.encode()
        raw += b" " * (-len(raw) % 8)
        size = len(data) - 8 - struct.unpack("<Q", data[:8])[0] + rng.choice([0, 0, 0, -1, 1])
        planted = _with_header(data, raw, size)
        assert _read(planted) == _loop(planted, monkeypatch), header
    assert sum(taken) > 300  # renamed tensors still take the template; the rest were judged without it


def test_templates_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """No more layouts than the bound, and no more templates per layout than its own: a hostile stream of
    headers of every count and layout keeps the cache small."""
    monkeypatch.setattr(templates_module, "_TEMPLATES_HELD", 3)
    for count in range(1, 12):
        for copy in range(3):
            tensors = {f"t{copy}.{i}": np.zeros((i + 1,), np.float32) for i in range(count)}
            _read(save(tensors))
        assert len(templates_module._TEMPLATES) <= 3
    taken = _hits(monkeypatch)
    for layout in range(24):  # buffers as long, 24 layouts: 16 kept, the latest first
        for copy in range(2):
            data = _same_length(layout, copy)
            assert _read(data) == _loop(data, monkeypatch)
    assert taken[-1] and len(templates_module._TEMPLATES) <= 3
    assert all(len(templates) <= templates_module._TEMPLATES_PER_KEY
               for templates in templates_module._TEMPLATES.values())
    monkeypatch.setattr(templates_module, "_TEMPLATE_CHARS", 1000)  # the text they hold together: emptied past it
    for layout in range(6):  # a layout of its own each, met twice: the one before it is let go
        for copy in range(2):
            _read(save({f"layer.{copy}.{i}": np.zeros((2 + layout,), np.float32) for i in range(20)}))
        assert len(templates_module._TEMPLATES) == 1 and len(next(iter(templates_module._TEMPLATES.values()))) == 1
    big = {f"t.{i}": np.zeros((1,), np.float32) for i in range(40_000)}  # a header past the templates' size
    data = save(big)
    (length,) = struct.unpack("<Q", data[:8])
    assert length > templates_module._TEMPLATE_BYTES
    assert templates_module.cut(data[8:8 + length], pattern.frame(data[8:8 + length])) is None


def _same_length(layout: int, copy: int) -> bytes:
    """Two tensors whose widths sum to 25 floats: a layout of its own per ``layout``, one buffer length for all."""
    return save({f"t{copy}.a": np.zeros((layout + 1,), np.float32), f"t{copy}.b": np.zeros((24 - layout,), np.float32)})


def test_layouts_not_met_again_stop_being_kept_until_one_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past as many misses in a row as a buffer length keeps templates, a header no longer leaves one (its split
    is a fifth of its read); a header read from a template again starts keeping them again."""
    taken = _hits(monkeypatch)
    for copy in range(2):
        _read(_same_length(0, copy))  # met, then kept
    for layout in range(1, templates_module._TEMPLATES_PER_KEY + 1):
        _read(_same_length(layout, 0))  # each a miss: kept while the misses are fewer than the bound
    assert templates_module._MISSES[next(iter(templates_module._TEMPLATES))] == templates_module._TEMPLATES_PER_KEY
    fresh = templates_module._TEMPLATES_PER_KEY + 1
    for copy in range(2):
        _read(_same_length(fresh, copy))
    assert taken[-2:] == [False, False]  # not kept: its second header is read in full too
    _read(_same_length(1, 1))
    assert taken[-1]  # a kept layout met again
    for copy in range(2):
        _read(_same_length(fresh, copy))
    assert taken[-2:] == [False, True]  # kept again


def test_a_tensor_named_like_the_metadata_is_not_read_as_a_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    """``{"__metadata__":{...},"__metadata__":{"dtype":...}}``: the compact pattern once listed the second key as a
    tensor, where the parse (and the Rust reader) refuse the duplicate key."""
    header = b'{"__metadata__":{"a":"b"},"__metadata__":{"dtype":"BF16","shape":[8,4],"data_offsets":[0,64]}}'
    header += b" " * (-len(header) % 8)
    data = struct.pack("<Q", len(header)) + header + bytes(64)
    assert pattern.read_compact(header, BytesSource(data), len(header)) is None
    assert _read(data) == _loop(data, monkeypatch) == "error: duplicate key '__metadata__' in header"


def test_metadata_listed_after_the_tensors_is_kept_with_each_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A header that lists ``__metadata__`` after its tensors (as valid): each file's metadata is its own, never
    a template's, so no template holds a metadata key between its names."""
    for i in range(4):
        entries = {f"layer.{i}.w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "__metadata__": {"format": "pt"}}
        header = json.dumps(entries).encode()
        data = struct.pack("<Q", len(header)) + header + bytes(8)
        scan = _read(data)
        assert scan == _loop(data, monkeypatch)
        assert scan.metadata == {"format": "pt"}  # type: ignore[attr-defined]
