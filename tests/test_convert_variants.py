"""convert on repositories with several weight sets: the primary one by default, another by --variant.

The folders are written by transformers itself (`save_pretrained` and `save_pretrained(variant="fp16")`),
as the weight-set tests write them; the outputs are loaded by transformers' own `from_pretrained`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from layouts import transformers_fp16_variant  # noqa: E402
from test_convert import assert_flax_loads, convert  # noqa: E402

pytestmark = pytest.mark.slow
KERNEL = ("bert", "encoder", "layer", "0", "attention", "self", "query", "kernel")


def torch_weights(src: Path, variant: str | None, dtype: torch.dtype | None = None) -> dict[str, np.ndarray]:
    """In the set's own dtype, not "auto": config.json was written by the fp16 save, the last one."""
    dtype = dtype or (torch.float16 if variant == "fp16" else torch.float32)
    model = transformers.BertForMaskedLM.from_pretrained(src, variant=variant, torch_dtype=dtype)
    return {name: t.detach().numpy() for name, t in model.state_dict().items()}


def test_default_weights_are_converted_and_the_variant_left_alone(tmp_path: Path) -> None:
    src = tmp_path / "bert"
    transformers_fp16_variant(src)
    out = tmp_path / "flax"
    assert convert(src, "--to", "flax", "--out", out) == 0
    params = assert_flax_loads(out)
    assert {a.dtype.name for a in params.values()} == {"float32"}
    query = torch_weights(src, None)["bert.encoder.layer.0.attention.self.query.weight"]
    assert params[KERNEL].tobytes() == np.ascontiguousarray(query.T).tobytes()
    assert not [p.name for p in out.iterdir() if "fp16" in p.name]  # the variant's index is not carried


def test_variant_flag_converts_that_set_bit_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bert"
    transformers_fp16_variant(src)
    out, back = tmp_path / "flax16", tmp_path / "back"
    assert convert(src, "--to", "flax", "--out", out, "--variant", "fp16") == 0
    assert "variant fp16" in capsys.readouterr().out
    params = assert_flax_loads(out)
    assert {a.dtype.name for a in params.values()} == {"float16"}
    query = torch_weights(src, "fp16")["bert.encoder.layer.0.attention.self.query.weight"]
    assert query.dtype == np.float16
    assert params[KERNEL].tobytes() == np.ascontiguousarray(query.T).tobytes()
    assert convert(out, "--to", "torch", "--out", back) == 0
    again = torch_weights(back, None, torch.float16)  # default names, fp16 weights
    assert not list(back.glob("*fp16*"))
    for name, array in torch_weights(src, "fp16").items():
        assert again[name].tobytes() == array.tobytes(), name


def test_variant_and_parity_compare_against_the_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bert"
    transformers_fp16_variant(src)
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--variant", "fp16", "--parity", "-f", "json") == 0
    report = capsys.readouterr().out
    assert "(converted back, bit-exact)" in report


def test_absent_variant_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bert"
    transformers_fp16_variant(src)
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--variant", "bf16") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ckpt-guard: error: {src}: no 'bf16' variant (variants here: fp16)"]
    assert not (tmp_path / "f").exists()


def test_variant_only_repository_needs_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bert"
    transformers_fp16_variant(src)
    (src / "model.safetensors").unlink()
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"ckpt-guard: error: {src}: no default weights, only the variant(s) fp16: choose one with "
                   "--variant")
    assert not (tmp_path / "f").exists()
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--variant", "fp16") == 0
    assert_flax_loads(tmp_path / "f")


def test_a_single_file_beside_its_own_index_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stale model.safetensors left beside model.safetensors.index.json: which one is current is a guess."""
    src = tmp_path / "bert"
    transformers_fp16_variant(src)
    shutil.copy(src / "model.safetensors.index.fp16.json", src / "model.safetensors.index.json")
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 2
    err = capsys.readouterr().err.strip()
    assert "both model.safetensors and model.safetensors.index.json hold the same copy" in err
    assert not (tmp_path / "f").exists()
