"""Parity streams a Flax checkpoint whose big leaves are chunked arrays, reading them chunk by chunk.

``flax.serialization`` stores a leaf over ``MAX_CHUNK_SIZE`` bytes (2**30) as a map of 1-D chunks,
which has no single byte range (``guard.convert.read.flax_chunks``).  Here ``MAX_CHUNK_SIZE`` is lowered to
10 kB, so a tiny Llama's vocabulary matrices and MLP kernels are written chunked (the last chunk of
each a partial one) while its attention kernels stay plain leaves: the same file layout a 70B model
has, in seconds.  The PyTorch side is saved by transformers, the Flax side converted by ckpt-guard
and re-serialized by flax with the lowered limit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
import transformers  # noqa: E402
from flax import serialization  # noqa: E402
from flax.traverse_util import flatten_dict, unflatten_dict  # noqa: E402
from test_convert import convert  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.parity.run import run_parity  # noqa: E402
from guard.readers import scan_file  # noqa: E402
from guard.sources import LocalFile  # noqa: E402

# streamed, block-located verdicts: both sides in this process, which needs transformers 4's Flax classes
pytestmark = [pytest.mark.slow, pytest.mark.transformers4]
CHUNK_BYTES = 10_000  # bf16: 5,000 elements a chunk; fp32: 2,500
MARKER = b"__msgpack_chunked_array__"
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
              architectures=["LlamaForCausalLM"])
# over 10 kB in bf16 (256x64 and 64x128 matrices: 32 kB and 16 kB); q_proj and o_proj (8 kB) stay whole
CHUNKED = {"model/embed_tokens/embedding", "lm_head/kernel",
           *(f"model/layers/{i}/mlp/{p}/kernel" for i in (0, 1) for p in ("gate_proj", "up_proj", "down_proj"))}
DTYPES = {"fp32": None, "bf16": torch.bfloat16}
Params = dict[tuple[str, ...], Any]


def write_chunked(flax_dir: Path, dest: Path, monkeypatch: pytest.MonkeyPatch,
                  plant: Callable[[Params], None] | None = None) -> Path:
    """``flax_dir``'s checkpoint (``plant`` applied) re-serialized by flax with leaves over 10 kB chunked."""
    dest.mkdir()
    (dest / "config.json").write_bytes((flax_dir / "config.json").read_bytes())
    flat = flatten_dict(serialization.msgpack_restore((flax_dir / "flax_model.msgpack").read_bytes()))
    if plant is not None:
        plant(flat)
    with monkeypatch.context() as patch:
        patch.setattr(serialization, "MAX_CHUNK_SIZE", CHUNK_BYTES)
        (dest / "flax_model.msgpack").write_bytes(serialization.to_bytes(unflatten_dict(flat)))
    return dest


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """(PyTorch dir saved by transformers, Flax dir converted by ckpt-guard: no chunks yet), per dtype."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(dtype: str) -> tuple[Path, Path]:
        if dtype not in cache:
            root = tmp_path_factory.mktemp(f"llama-{dtype}")
            torch.manual_seed(0)
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
            if DTYPES[dtype] is not None:
                model = model.to(DTYPES[dtype])
            model.save_pretrained(root / "torch")
            assert convert(root / "torch", "--to", "flax", "--out", root / "flax") == 0
            cache[dtype] = root / "torch", root / "flax"
        return cache[dtype]

    return get


@pytest.fixture
def whole_file_decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every msgpack document that ckpt-guard's own code decoded whole (what chunked reading exists to avoid)."""
    import sys

    decoded: list[str] = []
    restore = serialization.msgpack_restore

    def spy(data: bytes) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.split(".")[0] == "guard":
            decoded.append(f"{caller}: {len(data):,} bytes")
        return restore(data)

    monkeypatch.setattr(serialization, "msgpack_restore", spy)
    return decoded


def test_the_big_leaves_are_chunked_and_read_back_bit_exactly(converted: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from guard.convert.read.flax_chunks import read_chunked
    from guard.readers.flax_msgpack import chunk_ranges

    flax_dir = write_chunked(converted("bf16")[1], tmp_path / "flax", monkeypatch)
    raw = (flax_dir / "flax_model.msgpack").read_bytes()
    assert raw.count(MARKER) == len(CHUNKED)
    with LocalFile(flax_dir / "flax_model.msgpack") as source:
        scan = scan_file(source)
    with LocalFile(flax_dir / "flax_model.msgpack") as source:
        ranges = chunk_ranges(source)
    assert set(ranges) == CHUNKED and all(len(r) > 1 for r in ranges.values())
    assert not scan.findings, [f.message for f in scan.findings]
    assert {t.name for t in scan.tensors if t.data_start is None} == CHUNKED  # no single byte range
    assert len(scan.tensors) > len(CHUNKED)  # the attention kernels and norms are plain leaves
    expected = flatten_dict(serialization.msgpack_restore(raw), sep="/")
    for info in (t for t in scan.tensors if t.name in CHUNKED):
        assert np.asarray(expected[info.name]).size % (CHUNK_BYTES // 2)  # a partial last chunk, too
        array = read_chunked(info, ranges[info.name])
        assert array.dtype == expected[info.name].dtype and array.shape == expected[info.name].shape
        assert array.tobytes() == np.asarray(expected[info.name]).tobytes(), info.name


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_chunked_checkpoint_streams_and_passes(converted: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 whole_file_decodes: list[str], dtype: str) -> None:
    torch_dir, converted_flax = converted(dtype)
    flax_dir = write_chunked(converted_flax, tmp_path / "flax", monkeypatch)
    assert (flax_dir / "flax_model.msgpack").read_bytes().count(MARKER) >= len(CHUNKED)
    out = tmp_path / "parity.json"
    assert main(["parity", str(torch_dir), str(flax_dir), "-f", "json", "-o", str(out)]) == 0
    parity = json.loads(out.read_text())["extra"]["parity"]
    assert parity["passed"] is True, parity["comparisons"]
    # streamed, the head and embedding too: a chunked leaf that could not be read would have sent
    # the run whole through transformers (streamed false) or kept the leaves resident
    assert parity["streamed"] is True and parity["blocks"] == 2, parity.get("not_streamed")
    assert parity["leaves_streamed"] == ["flax", "torch"], parity.get("leaves_resident")
    assert whole_file_decodes == []  # each chunked leaf read chunk by chunk, never the file decoded whole


def scaled(name: str) -> Callable[[Params], None]:
    def plant(flat: Params) -> None:
        key = tuple(name.split("/"))
        flat[key] = (flat[key].astype(np.float32) * 1.01).astype(flat[key].dtype)

    return plant


@pytest.mark.parametrize(("tensor", "block"), [("lm_head/kernel", "lm_head"),
                                               ("model/layers/1/mlp/down_proj/kernel", "model.layers.1.mlp")])
def test_a_scaled_chunked_kernel_is_cg302_naming_its_block(converted: Any, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           whole_file_decodes: list[str], tensor: str,
                                                           block: str) -> None:
    assert tensor in CHUNKED
    torch_dir, converted_flax = converted("bf16")
    flax_dir = write_chunked(converted_flax, tmp_path / "bad", monkeypatch, scaled(tensor))
    findings, figures = run_parity(torch_dir, flax_dir)
    assert findings and {f.code for f in findings} == {"CG302"}, [f.message for f in findings]
    assert figures["streamed"] is True, figures.get("not_streamed")
    assert figures["leaves_streamed"] == ["flax", "torch"], figures.get("leaves_resident")
    fp32 = figures["comparisons"][0]
    assert fp32["name"] == "fp32" and not fp32["passed"]
    first = fp32["located"]["first"]
    assert first["module"] == block and first["max_rel"] > first["bound"], fp32["located"]
    message = next(f.message for f in findings if f.message.startswith("fp32 "))
    assert f"first block that disagrees: '{block}'" in message
    assert whole_file_decodes == []


def test_convert_reads_chunked_leaves_chunk_by_chunk(converted: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     whole_file_decodes: list[str]) -> None:
    """`convert --to torch` of the chunked checkpoint: no msgpack decoded whole, and the same bytes written
    as from the unchunked one."""
    flax_plain = converted("bf16")[1]
    flax_dir = write_chunked(flax_plain, tmp_path / "flax", monkeypatch)
    assert convert(flax_dir, "--to", "torch", "--out", tmp_path / "from-chunked") == 0
    assert whole_file_decodes == []
    assert convert(flax_plain, "--to", "torch", "--out", tmp_path / "from-plain") == 0
    assert (tmp_path / "from-chunked" / "model.safetensors").read_bytes() == \
        (tmp_path / "from-plain" / "model.safetensors").read_bytes()


def test_a_leaf_no_longer_chunked_is_one_line_naming_the_file(converted: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader reads the chunk ranges its file's walk gives now; a leaf the scan saw chunked that is not
    (the file replaced since) is a MalformedCheckpoint naming the file, never a silent decode of it whole."""
    from guard.convert.read.io_flax import FlaxChunkedLoader
    from guard.errors import MalformedCheckpoint

    flax_dir = write_chunked(converted("fp32")[1], tmp_path / "flax", monkeypatch)
    path = flax_dir / "flax_model.msgpack"
    with LocalFile(path) as source:
        scan = scan_file(source)
    chunked = next(t for t in scan.tensors if t.name in CHUNKED)
    plain = next(t for t in scan.tensors if t.data_start is not None)
    loader = FlaxChunkedLoader()
    assert loader.load(chunked).shape == chunked.shape
    with pytest.raises(MalformedCheckpoint, match=f"{path}: .* is no longer a chunked array"):
        loader.load(plain._replace(data_start=None, data_end=None))
