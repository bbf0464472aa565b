"""Planted errors in a converted Flax checkpoint are CG302, in fp32 and in bf16, across architectures.

The bf16 verdict is judged against PyTorch's own bf16 error, which is generous where Flax's bf16
arithmetic drifts (docs/parity.md); the defect-finding power comes from the fp32 comparison, where
both sides upcast the stored weights exactly.  Each kind of error is planted in the checkpoint
ckpt-guard wrote, and the finding must name the comparison and an output of the model.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from flax import serialization  # noqa: E402
from flax.traverse_util import flatten_dict, unflatten_dict  # noqa: E402
from legacy_env import here_has_flax_transformers, legacy_python  # noqa: E402
from test_convert import convert  # noqa: E402
from test_convert_families import save_tiny  # noqa: E402

from guard.parity.run import run_parity  # noqa: E402

pytestmark = pytest.mark.slow
Params = dict[tuple[str, ...], Any]
CLASSES = {"bert": "BertForMaskedLM", "gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
# per architecture: a square attention kernel, an MLP output kernel (its input is not zero-mean, so a
# constant shift shows) and the layer stack whose two layers are swapped
SQUARE = {"bert": "bert/encoder/layer/0/attention/self/query/kernel", "gpt2": "transformer/h/0/attn/c_proj/kernel",
          "llama": "model/layers/0/self_attn/q_proj/kernel"}
MLP_OUT = {"bert": "bert/encoder/layer/1/output/dense/kernel", "gpt2": "transformer/h/1/mlp/c_proj/kernel",
           "llama": "model/layers/1/mlp/down_proj/kernel"}
LAYERS = {"bert": "bert/encoder/layer", "gpt2": "transformer/h", "llama": "model/layers"}


def key(path: str) -> tuple[str, ...]:
    return tuple(path.split("/"))


def transposed(flat: Params, arch: str) -> None:
    flat[key(SQUARE[arch])] = flat[key(SQUARE[arch])].T.copy()


def scaled(flat: Params, arch: str) -> None:
    k = key(MLP_OUT[arch])
    flat[k] = (flat[k].astype(np.float32) * 1.01).astype(flat[k].dtype)


def shifted(flat: Params, arch: str) -> None:
    """Layer 0's: a constant shift of a kernel moves every feature alike, which the next LayerNorm removes,
    so it shows in the residual stream (hidden_states.1) before any norm sees it."""
    k = key(MLP_OUT[arch].replace("/1/", "/0/"))
    flat[k] = (flat[k].astype(np.float32) + 0.01).astype(flat[k].dtype)


def swapped_layers(flat: Params, arch: str) -> None:
    stack = key(LAYERS[arch])
    n = len(stack)
    zero = {k: v for k, v in flat.items() if k[:n] == stack and k[n] == "0"}
    one = {k: v for k, v in flat.items() if k[:n] == stack and k[n] == "1"}
    for k, v in zero.items():
        flat[(*stack, "1", *k[n + 1:])] = v
    for k, v in one.items():
        flat[(*stack, "0", *k[n + 1:])] = v


def one_bf16_ulp(flat: Params, arch: str) -> None:
    """Every element of one whole tensor one bf16 ulp up (in fp32 weights: 2^16 fp32 ulps, the same step)."""
    k = key(MLP_OUT[arch])
    a = flat[k]
    bits = a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)
    flat[k] = (bits + (1 if a.dtype.itemsize == 2 else 1 << 16)).astype(bits.dtype).view(a.dtype)


PLANTS: dict[str, tuple[Callable[[Params, str], None], str]] = {
    "transposed-kernel": (transposed, "bert"),
    "scaled-tensor": (scaled, "llama"),
    "shifted-tensor": (shifted, "gpt2"),
    "swapped-layers": (swapped_layers, "gpt2"),
    "one-bf16-ulp-over-a-layer": (one_bf16_ulp, "llama"),
}
DTYPES = {"fp32": None, "bf16": torch.bfloat16}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple[Path, Path]]:
    cache: dict[tuple[str, str], tuple[Path, Path]] = {}

    def get(arch: str, dtype: str) -> tuple[Path, Path]:
        if (arch, dtype) not in cache:
            root = tmp_path_factory.mktemp(f"{arch}-{dtype}")
            src = save_tiny(root, arch, CLASSES[arch], dtype=DTYPES[dtype])
            assert convert(src, "--to", "flax", "--out", root / "flax") == 0
            cache[arch, dtype] = src, root / "flax"
        return cache[arch, dtype]

    return get


def planted(flax_dir: Path, dest: Path, plant: Callable[[Params, str], None], arch: str) -> Path:
    shutil.copytree(flax_dir, dest)
    path = dest / "flax_model.msgpack"
    flat = {k: np.array(v) for k, v in flatten_dict(serialization.msgpack_restore(path.read_bytes())).items()}
    before = {k: v.copy() for k, v in flat.items()}
    plant(flat, arch)
    assert any(not np.array_equal(flat[k], before[k]) for k in flat), "the plant changed nothing"
    assert all(flat[k].shape == before[k].shape and flat[k].dtype == before[k].dtype for k in flat)
    path.write_bytes(serialization.msgpack_serialize(unflatten_dict(flat)))
    return dest


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", list(PLANTS))
def test_a_planted_error_is_cg302_naming_the_output(converted: Any, tmp_path: Path, kind: str, dtype: str) -> None:
    plant, arch = PLANTS[kind]
    src, flax_dir = converted(arch, dtype)
    # the Flax side here under transformers 4.x, else in the transformers-4 environment (the worker)
    flax_python = None if here_has_flax_transformers() else legacy_python()
    findings, figures = run_parity(src, planted(flax_dir, tmp_path / "bad", plant, arch), flax_python=flax_python)
    assert findings and {f.code for f in findings} == {"CG302"}, [f.message for f in findings]
    assert figures["passed"] is False and figures["stored_dtype"]["flax"] == ("BF16" if dtype == "bf16" else "F32")
    first = findings[0].message
    assert first.startswith("fp32 (torch:fp32 vs flax:fp32): max_rel = "), first  # the sharpest comparison
    named = re.search(r" on '([^']+)' exceeds ", first)
    assert named and named.group(1) in figures["comparisons"][0]["outputs"], first
