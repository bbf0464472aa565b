"""A shard index proven equal to its shards' headers instead of parsed (guard.inventory.index_proof).

The index that ``save_pretrained`` (and huggingface_hub's ``save_torch_state_dict``) writes is proven,
not parsed: its weight map is the shards' own, with no CG004.  Every other index, and every planted
defect, gets exactly what the parse and CG004's check give: the same findings, the same weight map.
The proof is a shortcut for the index that is right, never a second judge of one that is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from guard.cli import main
from guard.inventory import discover_models, discovery, index_proof, load_local_model
from guard.inventory.index_proof import HeaderMap

INDEX = "model.safetensors.index.json"


def tiny_llama(root: Path, *, layers: int = 3) -> Path:
    """A tiny Llama saved by transformers in shards of a few tensors each, with its index."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(root, max_shard_size="3KB")
    return root


def inventory(root: Path):  # type: ignore[no-untyped-def]
    (model,) = discover_models([root])
    return load_local_model(model)


def scanned(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["scan", "--format", "json", "--no-summary", str(root)])
    return code, json.loads(capsys.readouterr().out)


def parsed_as_before(root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                     ) -> tuple[tuple[int, dict], tuple[int, dict], list[bool]]:
    """The scan with the proof, the scan with every index parsed (the proof refused), and what was proven."""
    proven = [index.proven for index in inventory(root).indexes]
    with_proof = scanned(root, capsys)
    with monkeypatch.context() as patch:
        patch.setattr(index_proof, "prove_index", lambda source, scans, memo=None: False)
        without = scanned(root, capsys)
    return with_proof, without, proven


def test_transformers_index_is_proven_and_equal_to_its_parse(tmp_path: Path) -> None:
    root = tiny_llama(tmp_path / "llama")
    shards = sorted(p.name for p in root.glob("model-*.safetensors"))
    assert len(shards) > 3
    (index,) = inventory(root).indexes
    assert index.proven and index.text == "" and isinstance(index.weight_map, HeaderMap)
    expected = json.loads((root / INDEX).read_text())["weight_map"]
    assert len(index.weight_map) == len(expected)
    assert dict(index.weight_map) == expected and list(index.weight_map) == list(expected)  # key order too
    assert index.weight_map == expected and set(index.weight_map.values()) == set(shards)


def test_huggingface_hub_index_agrees_either_way(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's own writer (its index's key order is its own): the same verdict, proven or parsed."""
    from huggingface_hub import save_torch_state_dict

    torch.manual_seed(0)
    state = {f"layers.{i}.{part}.weight": torch.randn(16, 16) for i in range(6) for part in ("q", "k", "norm")}
    (tmp_path / "hub").mkdir()
    save_torch_state_dict(state, tmp_path / "hub", max_shard_size="4KB")
    (index,) = inventory(tmp_path / "hub").indexes
    assert dict(index.weight_map) == json.loads((tmp_path / "hub" / INDEX).read_text())["weight_map"]
    with_proof, without, _ = parsed_as_before(tmp_path / "hub", capsys, monkeypatch)
    assert with_proof == without and not [f for f in with_proof[1]["findings"] if f["code"] == "CG004"]


def _rewrite(root: Path, edit) -> None:  # type: ignore[no-untyped-def]
    path = root / INDEX
    path.write_bytes(edit(path.read_bytes()))


def _reindent(data: bytes, indent: int, *, ensure_ascii: bool = True, sort_keys: bool = True) -> bytes:
    return (json.dumps(json.loads(data), indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys) + "\n").encode()


def _move(data: bytes) -> bytes:
    """One tensor mapped to another shard than the one holding it."""
    doc = json.loads(data)
    name = next(iter(doc["weight_map"]))
    shards = sorted(set(doc["weight_map"].values()))
    doc["weight_map"][name] = next(s for s in shards if s != doc["weight_map"][name])
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _drop_entry(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["weight_map"].pop(sorted(doc["weight_map"])[-1])
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _add_entry(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["weight_map"]["model.extra.weight"] = sorted(doc["weight_map"].values())[0]
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _duplicate_line(data: bytes) -> bytes:
    """A key twice (json.loads keeps the last): the second copy maps it to another shard."""
    lines = data.split(b"\n")
    entries = [i for i, line in enumerate(lines) if line.rstrip(b",").endswith(b'.safetensors"')]
    at = entries[0]
    name, _, shard = lines[at].partition(b": ")
    other = next(lines[i].partition(b": ")[2] for i in entries
                 if lines[i].partition(b": ")[2].rstrip(b",") != shard.rstrip(b","))
    lines.insert(at + 1, name + b": " + other.rstrip(b",") + b",")
    return b"\n".join(lines)


def _unsorted(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["weight_map"] = dict(reversed(doc["weight_map"].items()))
    return (json.dumps(doc, indent=2) + "\n").encode()


# edit -> (the edit, whether the proof takes the index, whether the parse finds a defect in it)
EDITS = {
    "as written": (lambda d: d, True, False),
    "four spaces (mlx-lm's indent)": (lambda d: _reindent(d, 4), True, False),
    "one space": (lambda d: _reindent(d, 1), True, False),
    "no final newline": (lambda d: d.rstrip(b"\n"), True, False),
    "map before metadata": (lambda d: (json.dumps({"weight_map": json.loads(d)["weight_map"],
                                                   "metadata": json.loads(d)["metadata"]}, indent=2) + "\n").encode(),
                            True, False),
    "keys unsorted": (_unsorted, False, False),
    "compact JSON": (lambda d: json.dumps(json.loads(d), separators=(",", ":")).encode(), False, False),
    "weight_map in metadata too": (lambda d: d.replace(b'"metadata": {', b'"metadata": {\n    "weight_map": 1,', 1),
                                   False, False),
    "a second, empty map after": (lambda d: d.rstrip().rstrip(b"}") + b',\n  "weight_map": {}\n}\n', False, True),
    "trailing garbage": (lambda d: d + b"x", False, True),
    "truncated": (lambda d: d[: len(d) // 2], False, True),
    "a tensor moved": (_move, False, True),
    "a tensor dropped": (_drop_entry, False, True),
    "a tensor added": (_add_entry, False, True),
    "a key twice": (_duplicate_line, False, True),
    "not an object": (lambda d: b"[" + d + b"]", False, True),
    "a shard renamed": (lambda d: d.replace(b"model-00001-of-", b"model-00009-of-"), False, True),
    "a BOM": (lambda d: b"\xef\xbb\xbf" + d, False, True),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_index_edits_get_what_the_parse_gives(edit: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    root = tiny_llama(tmp_path / "llama", layers=2)
    change, proven, defect = EDITS[edit]
    _rewrite(root, change)
    with_proof, without, was_proven = parsed_as_before(root, capsys, monkeypatch)
    assert with_proof == without
    assert was_proven == [proven]
    found = [f for f in with_proof[1]["findings"] if f["code"] in ("CG001", "CG004")]
    assert bool(found) == defect, found


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_names_with_escapes_or_other_scripts(ensure_ascii: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A quote, a backslash or a non-ASCII letter in a name: json.dumps escapes them (and ``ensure_ascii`` every
    non-ASCII letter), which the proof never writes: parsed.  Unescaped UTF-8 is proven."""
    from huggingface_hub import save_torch_state_dict

    state = {'quote"d.weight': torch.ones(8, 8), "back\\slash.weight": torch.ones(8, 8),
             "ñame.weight": torch.ones(8, 8), "plain.weight": torch.ones(8, 8)}
    root = tmp_path / "names"
    root.mkdir()
    save_torch_state_dict(state, root, max_shard_size=300)
    _rewrite(root, lambda d: _reindent(d, 2, ensure_ascii=ensure_ascii))
    with_proof, without, proven = parsed_as_before(root, capsys, monkeypatch)
    assert with_proof == without and proven == [False]  # the quote and the backslash are escaped either way
    state = {"ñame.weight": torch.ones(8, 8), "plain.weight": torch.ones(8, 8), "zeta.weight": torch.ones(8, 8)}
    other = tmp_path / "letters"
    other.mkdir()
    save_torch_state_dict(state, other, max_shard_size=300)
    _rewrite(other, lambda d: _reindent(d, 2, ensure_ascii=ensure_ascii))
    with_proof, without, proven = parsed_as_before(other, capsys, monkeypatch)
    assert with_proof == without and proven == [not ensure_ascii]


def test_a_name_in_two_shards_is_parsed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two shards holding one name, and an index listing it twice (once per shard): byte for byte what the
    headers would make, but a map holds a name once, so the parse (and CG004) judge it."""
    from safetensors.torch import save_file

    root = tmp_path / "twice"
    root.mkdir()
    save_file({"a.weight": torch.ones(2), "b.weight": torch.ones(2)}, root / "model-00001-of-00002.safetensors")
    save_file({"a.weight": torch.ones(2)}, root / "model-00002-of-00002.safetensors")
    entries = ['    "a.weight": "model-00001-of-00002.safetensors"',
               '    "a.weight": "model-00002-of-00002.safetensors"',
               '    "b.weight": "model-00001-of-00002.safetensors"']
    (root / INDEX).write_text('{\n  "metadata": {\n    "total_size": 24\n  },\n  "weight_map": {\n'
                              + ",\n".join(entries) + "\n  }\n}\n")
    with_proof, without, proven = parsed_as_before(root, capsys, monkeypatch)
    assert proven == [False] and with_proof == without
    assert [f for f in with_proof[1]["findings"] if f["code"] == "CG004"]


def test_a_large_index_is_compared_from_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past STREAMED_INDEX_BYTES the index is never read whole: compared a chunk at a time from the open file,
    which is closed when the inventory is built; a bad one is read whole and parsed, as any other."""
    root = tiny_llama(tmp_path / "llama", layers=2)
    opened: list[Counted] = []

    class Counted(discovery.LocalFile):  # type: ignore[name-defined,misc]
        closed = False

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            opened.append(self)

        def close(self) -> None:
            self.closed = True
            super().close()

    monkeypatch.setattr(discovery, "STREAMED_INDEX_BYTES", 64)
    monkeypatch.setattr(index_proof, "_CHUNK", 5)  # several chunks from a tiny index
    monkeypatch.setattr(discovery, "LocalFile", Counted)
    (index,) = inventory(root).indexes
    streamed = [s for s in opened if s.path.endswith(INDEX)]
    assert index.proven and len(streamed) == 1 and streamed[0].closed
    assert streamed[0].bytes_read == (root / INDEX).stat().st_size  # its first bytes, kept, serve the rest
    _rewrite(root, _move)
    (index,) = inventory(root).indexes
    assert not index.proven and dict(index.weight_map) == json.loads((root / INDEX).read_text())["weight_map"]


def test_header_map_builds_only_when_read(tmp_path: Path) -> None:
    root = tiny_llama(tmp_path / "llama", layers=2)
    inv = inventory(root)
    (index,) = inv.indexes
    weight_map = index.weight_map
    assert isinstance(weight_map, HeaderMap) and len(weight_map) > 10 and weight_map._map is None
    assert bool(weight_map) and weight_map._map is None  # its length and truth need no map
    first = next(iter(json.loads((root / INDEX).read_text())["weight_map"]))
    assert first in weight_map and weight_map[first] == weight_map.get(first) and weight_map._map is not None
    assert weight_map.get("no.such.tensor", "-") == "-" and "HeaderMap(" in repr(weight_map)


def test_an_empty_map_beside_shards_is_cg004(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Valid JSON whose map is empty: from_pretrained would find none of the shards' tensors.  One finding
    for the set, on the index's line; an index that is not JSON is CG001 alone, as before."""
    root = tiny_llama(tmp_path / "llama", layers=2)
    shards = len(list(root.glob("model-*.safetensors")))
    _rewrite(root, lambda d: (json.dumps({"metadata": json.loads(d)["metadata"], "weight_map": {}}, indent=2)
                              + "\n").encode())
    code, report = scanned(root, capsys)
    found = [f for f in report["findings"] if f["code"] == "CG004"]
    assert code == 1 and len(found) == 1 and found[0]["path"].endswith(INDEX)
    line = next(i for i, text in enumerate((root / INDEX).read_text().splitlines(), 1) if '"weight_map"' in text)
    assert f"maps no tensors: none of the {shards} shard file(s)" in found[0]["message"] and found[0]["line"] == line
    _rewrite(root, lambda d: d[:-3])
    _, report = scanned(root, capsys)
    assert {f["code"] for f in report["findings"] if f["path"].endswith(INDEX)} == {"CG001"}


_MLX_SAVE = """
import sys
import mlx.core as mx
import mlx.nn as nn
from mlx_lm import utils

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(16, 16)
        self.norm = nn.RMSNorm(16)

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [Block() for _ in range(12)]

# mlx-lm shards at whole gigabytes; four tensors a shard here, written (files and index) by save_model itself
utils.make_shards = lambda weights: [dict(list(weights.items())[i:i + 4]) for i in range(0, len(weights), 4)]
model = Tiny()
model.set_dtype(mx.bfloat16)
utils.save_model(sys.argv[1], model)
"""


def test_mlx_lm_index_is_proven(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """mlx-lm's own `save_model` (its index sorted, indented by four): proven; a tensor moved in it: parsed, CG004."""
    import subprocess

    from quant_mlx import MlxUnavailable, mlx_python

    try:
        python = mlx_python()
    except MlxUnavailable as exc:
        pytest.skip(str(exc))
    root = tmp_path / "mlx"
    subprocess.run([str(python), "-c", _MLX_SAVE, str(root)], check=True, timeout=300)
    assert len(list(root.glob("model-*-of-*.safetensors"))) > 3 and b'\n    "weight_map"' in (root / INDEX).read_bytes()
    (index,) = inventory(root).indexes
    assert index.proven and dict(index.weight_map) == json.loads((root / INDEX).read_text())["weight_map"]
    with_proof, without, _ = parsed_as_before(root, capsys, monkeypatch)
    assert with_proof == without and not [f for f in with_proof[1]["findings"] if f["code"] == "CG004"]
    _rewrite(root, lambda d: _move(d).replace(b'\n  ', b'\n    '))
    with_proof, without, proven = parsed_as_before(root, capsys, monkeypatch)
    assert proven == [False] and with_proof == without
    assert [f for f in with_proof[1]["findings"] if f["code"] == "CG004"]
