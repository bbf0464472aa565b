"""The rules read each weight set's tensors grouped by dtype, once; what they report is what a walk of
every tensor in file order reports (the hook's speed must not change a verdict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from scanning import json_scan  # noqa: E402

from guard.inventory.sets import WeightSet  # noqa: E402
from guard.inventory.stats import dtype_summary  # noqa: E402
from guard.tensors import FileScan, TensorInfo  # noqa: E402


def _sharded(folder: Path, shards: list[dict[str, object]]) -> None:
    """Shards written by safetensors, with the index transformers writes beside them."""
    folder.mkdir()
    weight_map = {}
    for i, tensors in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        safetensors_numpy.save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_a_tie_in_cg102_goes_by_the_first_tensor_the_policy_judges(tmp_path: Path, capsys) -> None:
    # shard 1: a norm (kept in fp32 by the default keep-fp32 globs) leads fp32, then an fp16 tensor;
    # shard 2: an fp32 tensor as large as the fp16 one.  Walking the set's tensors, the policy meets
    # fp16 first, so fp32 is the minority named, whichever dtype the set's first tensor has.
    _sharded(tmp_path / "m", [
        {"a.norm.weight": np.ones(4, np.float32), "b.weight": np.ones(8, np.float16)},
        {"c.weight": np.ones(8, np.float32)},
    ])
    code, report = json_scan(capsys, str(tmp_path / "m"), "--expect", "uniform")
    mixed = [f for f in report["findings"] if f["code"] == "CG102"]
    assert code == 1 and len(mixed) == 1
    assert mixed[0]["tensor"] == "c.weight"
    assert "fp16: 1 tensors / 8 params, fp32: 1 tensors / 8 params" in mixed[0]["message"]


def test_grouped_summary_is_the_per_tensor_summary() -> None:
    """Sub-byte codes round up per tensor, block types per block, unknown codes have no size."""
    tensors = (TensorInfo("a", "F32", (3, 5), "f"), TensorInfo("b", "F4", (3,), "f"),
               TensorInfo("c", "Q4_0", (40,), "f"), TensorInfo("d", "F4", (5,), "f"),
               TensorInfo("e", "zarr:odd", (2,), "f"), TensorInfo("f", "BF16", (15,), "f"),
               TensorInfo("g", "BOOL", (), "f"))
    scan = FileScan(path="f", format="gguf", size=1, tensors=tensors)
    ws = WeightSet("f", "weights", "file", "f", "gguf", None, False, (scan,), (), None, True, {})
    assert ws.dtype_summary() == dtype_summary(tensors)
    assert list(ws.dtype_summary()) == list(dtype_summary(tensors))  # the same order: ties by first tensor
    assert ws.quantized_codes() == ["F4", "Q4_0"]
    assert ws.parameters_by_dtype() == {"F32": 15, "F4": 8, "Q4_0": 40, "zarr:odd": 2, "BF16": 15, "BOOL": 1}


def test_tied_aliases_are_still_counted_once() -> None:
    tied = (TensorInfo("emb", "F32", (4, 2), "f", storage="0", storage_offset=0),
            TensorInfo("head", "F32", (4, 2), "f", storage="0", storage_offset=0))
    scan = FileScan(path="f", format="torch-zip", size=1, tensors=tied)
    ws = WeightSet("f", "weights", "file", "f", "torch", None, False, (scan,), (), None, True, {})
    assert ws.dtype_summary()["F32"].parameters == 8
    assert ws.parameters_by_dtype() == {"F32": 16}  # the set's tensors, as CG107's shares read them
