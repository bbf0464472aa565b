"""convert moves bf16 and fp8 bytes as numpy integers, and imports ml_dtypes only to cast.

ml_dtypes 0.7.0's import costs ~0.75 s, a third of a 1.5 GB conversion: a conversion that casts
nothing never needs a bf16 or fp8 value, only the bits and the dtype's name.  These tests hold the
integer storage to ml_dtypes' own dtypes (width, name, code) and run whole conversions, every way,
in a fresh interpreter that must end without ml_dtypes, whose outputs safetensors and flax read back
bit for bit (NaN payloads, -0 and subnormals included).  fp8 models are quantized sets, which convert
refuses without --dequantize (a cast); their codes' storage is held to ml_dtypes' above.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from flax.serialization import msgpack_restore  # noqa: E402
from flax.traverse_util import flatten_dict  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from guard import dtypes  # noqa: E402
from guard.write.bitviews import dtype_code, numpy_dtype, numpy_name, storage_dtype  # noqa: E402

CODES = sorted(code for code, info in dtypes.DTYPES.items() if info.numpy and info.bits >= 8)
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("code", CODES)
def test_storage_holds_the_same_bytes_under_the_same_name(code: str) -> None:
    real = numpy_dtype(code)
    assert storage_dtype(code).itemsize == real.itemsize
    assert numpy_name(code) == real.name and dtype_code(numpy_name(code)) == code
    assert type(storage_dtype(code)).__module__ == "numpy.dtypes"  # numpy's own: no ml_dtypes needed
    if real.kind in "biuc" or real.name in ("float16", "float32", "float64"):
        assert storage_dtype(code) == real


@pytest.mark.parametrize("code", ["F4", "F6_E2M3", "F6_E3M2", "Q4_0", "NO_SUCH"])
def test_codes_without_a_byte_wide_dtype_are_refused_both_ways(code: str) -> None:
    with pytest.raises(ValueError, match=code):
        storage_dtype(code)
    with pytest.raises(ValueError, match=code):
        numpy_dtype(code)


# where consecutive patterns start: the largest finite values, then inf and NaNs with payloads (both signs);
# the largest negative NaNs, then +0 and subnormals; +NaNs, then -0 and negative subnormals
STARTS = (0x7F78, 0xFF78, 0xFFF8, 0x7FF8)


def every_pattern(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Consecutive bf16 bit patterns, the norms' 16 included, across the special ones."""
    start = STARTS[seed % len(STARTS)]
    patterns = (torch.arange(int(np.prod(shape)), dtype=torch.int64) + start) % 2**16
    return patterns.to(torch.int32).to(torch.uint16).view(dtype).reshape(shape)


def tiny_llama(tmp: Path) -> Path:
    """A bf16 Llama written by transformers, its tensors re-saved with bit patterns from all over bf16."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    out = tmp / "llama"
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    tensors = load_file(out / "model.safetensors")
    for i, (name, t) in enumerate(sorted(tensors.items())):
        tensors[name] = every_pattern(tuple(t.shape), torch.bfloat16, seed=i)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


CONVERT_WITHOUT_ML_DTYPES = """
import sys
from guard.cli import main
code = main(sys.argv[1:])
sys.exit(code if code else 3 * ("ml_dtypes" in sys.modules))
"""


def convert(*args: object) -> None:
    done = subprocess.run([sys.executable, "-c", CONVERT_WITHOUT_ML_DTYPES, "convert", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.slow
def test_conversions_that_cast_nothing_import_no_ml_dtypes_and_keep_every_bit(tmp_path: Path) -> None:
    src = tiny_llama(tmp_path)
    source = load_file(src / "model.safetensors")
    convert(src, "--to", "flax", "--out", tmp_path / "flax")
    convert(src, "--to", "flax", "--layout", "orbax", "--out", tmp_path / "orbax")
    convert(tmp_path / "flax", "--to", "torch", "--out", tmp_path / "back")
    convert(tmp_path / "orbax", "--to", "torch", "--out", tmp_path / "back-orbax")

    leaves = flatten_dict(msgpack_restore((tmp_path / "flax" / "flax_model.msgpack").read_bytes()), sep="/")
    down = leaves["model/layers/0/mlp/down_proj/kernel"]
    assert down.dtype == ml_dtypes.bfloat16
    assert np.ascontiguousarray(down.T).tobytes() == bits(source["model.layers.0.mlp.down_proj.weight"])
    embed = leaves["model/embed_tokens/embedding"]
    assert embed.dtype == ml_dtypes.bfloat16 and embed.tobytes() == bits(source["model.embed_tokens.weight"])
    for back in ("back", "back-orbax"):
        again = load_file(tmp_path / back / "model.safetensors")
        assert sorted(again) == sorted(source)
        for name, t in source.items():
            assert again[name].dtype == t.dtype and bits(again[name]) == bits(t), (back, name)
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "llama"


@pytest.mark.slow
def test_a_cast_still_computes_with_ml_dtypes(tmp_path: Path) -> None:
    src = tiny_llama(tmp_path)
    done = subprocess.run([sys.executable, "-c", CONVERT_WITHOUT_ML_DTYPES, "convert", str(src), "--to", "torch",
                           "--dtype", "fp32", "--out", str(tmp_path / "fp32")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 3, (done.stdout[-2000:], done.stderr[-2000:])  # converted, with ml_dtypes
    source, wide = load_file(src / "model.safetensors"), load_file(tmp_path / "fp32" / "model.safetensors")
    for name, t in source.items():
        assert wide[name].dtype == torch.float32
        assert torch.equal(wide[name].isnan(), t.float().isnan())
        assert bits(torch.nan_to_num(wide[name], nan=0.0)) == bits(torch.nan_to_num(t.float(), nan=0.0)), name
