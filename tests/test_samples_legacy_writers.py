"""guard.samples' writers of the transformers-4 layouts, against transformers 4.57's own writers.

transformers 5 writes safetensors only and has no Flax classes, so the samples and tests write the pickled
``pytorch_model.bin`` layout (``save_torch_bin``) and the Flax copy (``flax_copy``) themselves.  Here, in
the transformers-4 environment, each is compared with what ``save_pretrained(safe_serialization=False)``
and ``FlaxAutoModel.from_pretrained(from_pt=True).save_pretrained`` write: the same files, the same
tensors bit for bit, the same index bytes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import numpy as np  # noqa: E402
from flax.serialization import msgpack_restore  # noqa: E402
from flax.traverse_util import flatten_dict  # noqa: E402

from guard.samples import flax_copy, save_torch_bin  # noqa: E402

pytestmark = pytest.mark.transformers4  # the references are transformers 4's writers and Flax classes


def tiny_bert() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32))


@pytest.mark.parametrize("options", [{}, {"max_shard_size": "8KB"}, {"variant": "fp16"},
                                     {"variant": "fp16", "max_shard_size": "8KB"}],
                         ids=["single", "sharded", "variant", "sharded-variant"])
def test_save_torch_bin_writes_what_transformers_4_writes(tmp_path: Path, options: dict) -> None:
    model = tiny_bert().half()  # tied decoder/embeddings: both names kept, as 4.x pickles them
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    model.save_pretrained(theirs, safe_serialization=False, **options)
    save_torch_bin(model, ours, **options)
    names = sorted(p.name for p in theirs.iterdir())
    assert names == sorted(p.name for p in ours.iterdir())
    assert any(n.endswith(".bin") for n in names)
    for name in names:
        if name.endswith(".bin"):
            a = torch.load(theirs / name, weights_only=True)
            b = torch.load(ours / name, weights_only=True)
            assert list(a) == list(b)
            for key in a:
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (name, key)
        else:  # config.json, the shard index: the same bytes
            assert (theirs / name).read_bytes() == (ours / name).read_bytes(), name
    if "max_shard_size" in options:
        index = next(n for n in names if "index" in n)
        assert json.loads((ours / index).read_text())["metadata"]["total_parameters"] == model.num_parameters()


@pytest.mark.parametrize("dtype", ["keep", "fp32", "bf16"])
def test_flax_copy_equals_transformers_4_from_pt(tmp_path: Path, dtype: str) -> None:
    model = tiny_bert().half()
    root = tmp_path / "bert"
    save_torch_bin(model, root)
    alone = tmp_path / "pt"  # from_pt reads the PyTorch files only
    alone.mkdir()
    for name in ("config.json", "pytorch_model.bin"):
        shutil.copyfile(root / name, alone / name)
    flax_copy(root, dtype=dtype)
    reference = transformers.FlaxBertForMaskedLM.from_pretrained(alone, from_pt=True)
    params = {"keep": lambda p: p, "fp32": reference.to_fp32, "bf16": reference.to_bf16}[dtype](reference.params)
    want = {k: np.asarray(v) for k, v in flatten_dict(params).items()}
    got = flatten_dict(msgpack_restore((root / "flax_model.msgpack").read_bytes()))
    assert set(got) == set(want)
    for key, array in want.items():
        assert got[key].dtype == array.dtype and got[key].shape == array.shape, key
        assert np.asarray(got[key]).tobytes() == array.tobytes(), key
