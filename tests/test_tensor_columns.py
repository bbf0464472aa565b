"""A safetensors file's tensors kept in columns: the same records, the same reports, fewer objects.

The compact reader keeps a file's tensors as columns (``guard.tensors.TensorColumns``); a set's
groups by dtype chain them (``TensorChain``), and the rules read the columns.  Every caller that
walks or indexes them must get exactly the records the general JSON parse makes, and every report
must be the same, byte for byte, whichever reading a header took.
"""

from __future__ import annotations

import json
import pickle
from itertools import compress
from pathlib import Path

import pytest

from guard.cli import main
from guard.readers import safetensors as reader
from guard.sources import BytesSource, LocalFile
from guard.tensors import (
    TENSOR_DTYPE,
    TENSOR_FILE,
    TENSOR_NAME,
    TENSOR_SHAPE,
    TENSOR_STORAGE,
    TensorChain,
    TensorColumns,
    TensorInfo,
    column,
    joined,
    select,
)

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
transformers = pytest.importorskip("transformers")

GETTERS = (TENSOR_NAME, TENSOR_DTYPE, TENSOR_SHAPE, TENSOR_FILE, TENSOR_STORAGE)


def _written(path: Path) -> Path:
    state = {"model.embed_tokens.weight": torch.zeros(16, 8, dtype=torch.bfloat16),
             "model.norm.weight": torch.ones(8, dtype=torch.float32),
             "model.layers.0.mlp.up_proj.weight": torch.zeros(12, 8, dtype=torch.bfloat16),
             "lm_head.weight": torch.zeros(16, 8, dtype=torch.float16),
             "model.rotary.inv_freq": torch.zeros(4, dtype=torch.int64)}
    safetensors_torch.save_file(state, str(path), metadata={"format": "pt"})
    return path


def _both(path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    compact = reader.read_safetensors(LocalFile(path, name=path.name))
    with monkeypatch.context() as patch:  # the entry loop alone: a record per tensor
        patch.setattr(reader, "read_fast", lambda *_: None)  # the reference alone
        general = reader.read_safetensors(LocalFile(path, name=path.name))
    return compact, general


def test_a_library_written_file_keeps_columns_that_make_the_general_parse_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compact, general = _both(_written(tmp_path / "model.safetensors"), monkeypatch)
    columns, records = compact.tensors, general.tensors
    assert type(columns) is TensorColumns and type(records) is tuple and len(records) == 5
    assert compact == general and columns == records and records == columns
    # fresh columns: nothing made yet; each field of each record as the parse gives it
    fresh = reader.read_safetensors(LocalFile(tmp_path / "model.safetensors", name="model.safetensors")).tensors
    for getter in GETTERS:
        assert list(column(getter, fresh)) == list(map(getter, records))
    assert fresh._records is None  # type: ignore[attr-defined]  # reading the columns made no record
    assert [t.data_start for t in columns] == [t.data_start for t in records]
    assert [t.data_end for t in columns] == [t.data_end for t in records]
    # a tuple's behaviour: indexes, slices, membership, search, order, hashing, its text
    assert columns[0] == records[0] and columns[-1] == records[-1] and columns[1:4] == records[1:4]
    assert columns[::-1] == records[::-1] and list(reversed(columns)) == list(reversed(records))
    with pytest.raises(IndexError):
        columns[5]  # noqa: B018
    assert records[2] in columns and TensorInfo("x", "F32", (1,), "model.safetensors") not in columns
    assert columns.index(records[3]) == 3 and columns.count(records[3]) == 1
    assert hash(columns) == hash(records) and repr(columns) == repr(records)
    assert columns + () == records and () + columns == records
    assert all(a is b for a, b in zip(columns, columns))  # made once per file: two walks meet the same records
    assert pickle.loads(pickle.dumps(compact)) == general


def test_select_and_chains_agree_with_compress_over_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, first_records = _both(_written(tmp_path / "a.safetensors"), monkeypatch)
    second, second_records = _both(_written(tmp_path / "b.safetensors"), monkeypatch)
    flags = [True, False, True, True, False]
    assert select(first.tensors, flags) == list(compress(first_records.tensors, flags))
    # a chain of a file's columns, a plain tuple, and another file's columns, as a set's group by dtype holds them
    loose = (TensorInfo("loose", "F32", (2,), "c.bin", storage="0"),)
    chain = joined([first.tensors, loose, second.tensors])
    records = first_records.tensors + loose + second_records.tensors
    assert type(chain) is TensorChain and len(chain) == 11 and chain == records and tuple(chain) == records
    for getter in GETTERS:
        assert list(column(getter, chain)) == list(map(getter, records))
    assert [chain[i] for i in range(-11, 11)] == [records[i] for i in range(-11, 11)]
    assert chain[3:9] == records[3:9]
    with pytest.raises(IndexError):
        chain[11]  # noqa: B018
    across = [False, True, False, False, True, True, True, False, False, False, True]  # across every boundary
    assert select(chain, across) == list(compress(records, across))
    # once a file's records are made, select gives those very objects (the rules' ``is`` between walks holds)
    made = first.tensors[0]
    assert select(first.tensors, [True])[0] is made
    assert pickle.loads(pickle.dumps(chain)) == records
    # parts with no columns join as one tuple, as the groups were before columns
    assert joined([loose, loose]) == loose + loose and type(joined([loose, loose])) is tuple
    assert joined([first.tensors]) is first.tensors


def test_a_hand_rolled_header_keeps_columns_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """``json.dumps``' separators (", " and ": "), as hand-rolled writers write them: the same columns."""
    entries = {"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    header = json.dumps(entries).encode()
    data = len(header).to_bytes(8, "little") + header + bytes(16)
    compact = reader.read_safetensors(BytesSource(data, name="hand.safetensors"))
    with monkeypatch.context() as patch:
        patch.setattr(reader, "read_fast", lambda *_: None)  # the reference alone
        general = reader.read_safetensors(BytesSource(data, name="hand.safetensors"))
    assert type(compact.tensors) is TensorColumns and compact == general
    assert [(t.name, t.data_start, t.data_end) for t in compact.tensors] == [("w", 8 + len(header), 16 + len(header)),
                                                                             ("b", 16 + len(header), 24 + len(header))]


def _report(directory: Path, out: Path, monkeypatch: pytest.MonkeyPatch, *, compact: bool) -> str:
    with monkeypatch.context() as patch:
        if not compact:
            patch.setattr(reader, "read_fast", lambda *_: None)  # the reference alone
        main(["scan", "--expect", "config", "--keep-fp32", "*.rotary*", "--format", "json", "-o", str(out),
              str(directory)])
    return out.read_text(encoding="utf-8")


def test_reports_are_byte_identical_whichever_reading_a_header_took(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A sharded Llama written by transformers' save_pretrained, then defects planted in a shard: the JSON
    report from the columns is the general parse's, byte for byte, and names the defects."""
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=2, dtype="float32")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    directory = tmp_path / "llama"
    model.save_pretrained(directory, max_shard_size="8KB")
    index = json.loads((directory / "model.safetensors.index.json").read_text(encoding="utf-8"))
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3
    clean = _report(directory, tmp_path / "clean.json", monkeypatch, compact=True)
    assert clean == _report(directory, tmp_path / "clean-general.json", monkeypatch, compact=False)
    assert json.loads(clean)["findings"] == []
    # planted: one shard's tensors cast to bf16 (CG101 against config.json's float32, CG102 mixed, CG104 on
    # its norms), as a converter that skipped a shard would leave it
    planted = next(s for s in shards if any("norm" in name and index["weight_map"][name] == s
                                            for name in index["weight_map"]))
    state = safetensors_torch.load_file(str(directory / planted))
    safetensors_torch.save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, str(directory / planted),
                                metadata={"format": "pt"})
    report = _report(directory, tmp_path / "planted.json", monkeypatch, compact=True)
    assert report == _report(directory, tmp_path / "planted-general.json", monkeypatch, compact=False)
    codes = {finding["code"] for finding in json.loads(report)["findings"]}
    assert {"CG101", "CG102", "CG104"} <= codes
