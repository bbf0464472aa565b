"""`convert --parity` on every PT/Flax pair of transformers 4.57, saved in fp32 and in bf16.

The conversion path imports no transformers; parity does, and runs both classes on the same inputs.
Where transformers' Flax code cannot run with the installed jax (the T5 family calls
``jnp.clip(a_max=)``, removed in jax 0.10) the test asserts that exact reason, and the conversion
is proven by the load check in test_convert_families.py plus a parity run with the old keyword
restored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from test_convert import convert  # noqa: E402
from test_convert_families import PAIRS, T5_FAMILY, old_clip, save_tiny  # noqa: E402

from guard.convert.map.families import FAMILIES  # noqa: E402
from guard.parity.run import run_parity  # noqa: E402

# every 4.57 PT/Flax pair, and the T5 family's jnp.clip patched in this process: transformers 4 here
pytestmark = [pytest.mark.slow, pytest.mark.transformers4]
CLIP_REASON = "does not run with the installed jax/flax: clip() got an unexpected keyword argument 'a_max'"


def convert_with_parity(tmp_path: Path, src: Path) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "r.json"
    code = convert(src, "--to", "flax", "--out", tmp_path / "f", "--parity", "-f", "json", "-o", report)
    return code, json.loads(report.read_text())


@pytest.mark.parametrize(("model_type", "pt_name", "flax_name"), PAIRS, ids=[p[1] for p in PAIRS])
def test_fp32_parity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_type: str, pt_name: str,
                     flax_name: str) -> None:
    src = save_tiny(tmp_path, model_type, pt_name)
    code, report = convert_with_parity(tmp_path, src)
    parity = report["extra"]["parity"]
    assert code == 0, report["findings"]
    if model_type in T5_FAMILY:
        assert [f["code"] for f in report["findings"]] == ["CG303"]
        assert parity["available"] is False and CLIP_REASON in parity["reason"], parity["reason"]
        import jax.numpy as jnp

        monkeypatch.setattr(jnp, "clip", old_clip())
        findings, parity = run_parity(src, tmp_path / "f")
        assert findings == [], [f.message for f in findings]
    else:
        expected = FAMILIES[model_type].pt_only.get(pt_name)  # BigBird's pooler: dropped with a warning
        assert [f["code"] for f in report["findings"]] == (["CG304"] if expected else []), report["findings"]
    assert parity["passed"] is True and parity["flax_class"] == flax_name
    assert parity["comparisons"][0]["tolerance"]["max_rel"] == 1e-5


@pytest.mark.parametrize(("model_type", "pt_name", "flax_name"), PAIRS, ids=[p[1] for p in PAIRS])
def test_bf16_parity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_type: str, pt_name: str,
                     flax_name: str) -> None:
    """Judged against PyTorch's own bf16 error: no warning, no special case, for every class."""
    if model_type in T5_FAMILY:
        import jax.numpy as jnp

        monkeypatch.setattr(jnp, "clip", old_clip())
    src = save_tiny(tmp_path, model_type, pt_name, dtype=torch.bfloat16)
    code, report = convert_with_parity(tmp_path, src)
    parity = report["extra"]["parity"]
    assert code == 0, report["findings"]
    assert [f for f in report["findings"] if f["code"] == "CG302"] == []
    assert parity["stored_dtype"] == {"torch": "BF16", "flax": "BF16"} and parity["passed"] is True
    by_name = {c["name"]: c for c in parity["comparisons"]}
    assert by_name["fp32"]["passed"] and by_name["fp32"]["tolerance"]["max_rel"] in (1e-5, 5e-5)
    low = by_name["flax vs fp32 reference"]
    assert low["passed"] and low["tolerance"]["rule"] == "relative"
    assert all({"own_max_rel", "bound"} <= set(o) for o in low["outputs"].values()), low["outputs"]


def test_speech_composite_saved_in_fp16(tmp_path: Path) -> None:
    """The seed's case: a wav2vec2 encoder with a BART decoder, saved in fp16, both ways and through parity."""
    from test_convert import safetensors_bits

    src = save_tiny(tmp_path, "speech-encoder-decoder", "SpeechEncoderDecoderModel", dtype=torch.float16)
    code, report = convert_with_parity(tmp_path, src)
    assert code == 0, report["findings"]
    parity = report["extra"]["parity"]
    assert parity["stored_dtype"] == {"torch": "F16", "flax": "F16"} and parity["passed"] is True
    assert {c["tolerance"]["dtype"] for c in parity["comparisons"] if c["judged"]} == {"F32", "F16"}
    assert convert(tmp_path / "f", "--to", "torch", "--out", tmp_path / "b") == 0
    assert safetensors_bits(tmp_path / "b") == safetensors_bits(src)
