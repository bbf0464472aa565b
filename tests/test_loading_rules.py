"""What CG123-CG127's messages claim transformers does, held to what transformers 5.25 did on the same file.

Each test writes a tiny model with transformers' own ``save_pretrained``, plants the defect a published
checkpoint had, runs ``from_pretrained`` on it (its loading report, its exception, the values it loaded)
and checks the scan's verdict and the claim its message makes against that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from scanning import json_scan  # noqa: E402
from test_loading import save, tensors, write  # noqa: E402


def _loading(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["code"] in ("CG123", "CG124", "CG125", "CG127")]


def test_missing_experts_message_says_transformers_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A per-expert Qwen3-MoE missing experts 2-3 of 4: transformers 5.25 raises (size mismatch), and with
    ignore_mismatched_sizes=True every expert of the fused parameter is random, the ones in the file too."""
    root = save(tmp_path / "moe", "qwen3_moe")
    saved = tensors(root)
    write(root, {k: v for k, v in saved.items() if not any(f".experts.{e}." in k for e in (2, 3))})
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        transformers.Qwen3MoeForCausalLM.from_pretrained(root)
    model, info = transformers.Qwen3MoeForCausalLM.from_pretrained(root, output_loading_info=True,
                                                                   ignore_mismatched_sizes=True)
    assert {name for name, *_ in info["mismatched_keys"]} >= {"model.layers.0.mlp.experts.gate_up_proj"}
    loaded = model.model.layers[0].mlp.experts.gate_up_proj.detach()
    kept = saved["model.layers.0.mlp.experts.0.gate_proj.weight"]
    assert not torch.equal(loaded[0, : kept.shape[0]], kept)  # expert 0 was in the file, and is random too
    code, report = json_scan(capsys, str(root))
    assert code == 1
    found = _loading(report)
    assert found and {f["code"] for f in found} == {"CG123"}, found
    for finding in found:
        assert "experts 2–3 of 4 in layers 0–1" in finding["message"]
        assert "merges the 2 experts it finds into a tensor for 2 where Qwen3MoeForCausalLM builds 4" in \
            finding["message"]
        assert "refuses it (RuntimeError, size mismatch" in finding["message"]
        assert "every expert of the parameter starts random" in finding["message"]
        assert "reports nothing" not in finding["message"]


def test_experts_numbered_past_the_count_fill_the_absent_slot(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Expert 3 of 4 saved as expert 4: transformers 5.25 merges the four it finds in index order, loads expert 4's
    weights as expert 3 and reports nothing; the scan says that, and does not claim the tensors are dropped."""
    root = save(tmp_path / "moe", "qwen3_moe")
    saved = tensors(root)
    write(root, {k.replace(".experts.3.", ".experts.4."): v for k, v in saved.items()})
    model, info = transformers.Qwen3MoeForCausalLM.from_pretrained(root, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    loaded = model.model.layers[0].mlp.experts.gate_up_proj.detach()
    moved = saved["model.layers.0.mlp.experts.3.gate_proj.weight"]
    assert torch.equal(loaded[3, : moved.shape[0]], moved)  # slot 3 holds what the file numbers 4
    code, report = json_scan(capsys, str(root))
    assert code == 1
    found = _loading(report)
    assert {f["code"] for f in found} == {"CG123"}, found  # nothing is dropped: no CG124
    for finding in found:
        assert "experts 3 of 4" in finding["message"]
        assert "merges the 4 experts it finds in index order and reports nothing: expert 4" in finding["message"]


def test_messages_do_not_claim_silence_for_experts() -> None:
    """The catalogue's and the docs' words for CG123 say what 5.25 does with absent experts (it refuses)."""
    from guard.catalogue import RULES

    [rule] = [r for r in RULES if r.code == "CG123"]
    text = json.dumps(rule)
    assert "says nothing" not in text and "refuses" in text
    doc = (Path(__file__).parents[1] / "docs" / "loading.md").read_text()
    assert "says nothing at all when a per-expert file lacks experts" not in doc
