"""CG124's fix: config.json's layer count set to the whole layers the file holds, an unsafe fix.

A Llama that transformers 5's save_pretrained wrote with 3 layers, its config.json then edited to say 2
(the config cut after the save): transformers drops layer 2 as "unexpected" and only logs it.  ``fix``
shows the config change and never applies it unasked; ``--unsafe-fixes`` applies it through the same
machinery as CG103's config rewrite, after which transformers loads every tensor.  Missing weights
(CG123) have no fix, and the plan says where the tensors should come from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from guard.cli import main  # noqa: E402

SMALL = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
             num_hidden_layers=3, max_position_embeddings=64)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three layers, as transformers 5's save_pretrained writes them (its own config.json text)."""
    root = tmp_path_factory.mktemp("saved") / "llama"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).save_pretrained(root)
    return root


def cut_config(saved: Path, dest: Path) -> Path:
    """The saved model with config.json's count edited to 2 by hand: one token changed, the rest as written."""
    root = Path(shutil.copytree(saved, dest))
    text = (root / "config.json").read_text()
    assert text.count('"num_hidden_layers": 3') == 1
    (root / "config.json").write_text(text.replace('"num_hidden_layers": 3', '"num_hidden_layers": 2'))
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def fix_run(capsys: pytest.CaptureFixture[str], *args: str, fmt: str = "text") -> tuple[int, str]:
    capsys.readouterr()
    code = main(["fix", "--format", fmt, *args])
    return code, capsys.readouterr().out


def scan(capsys: pytest.CaptureFixture[str], root: Path) -> dict:
    capsys.readouterr()
    main(["scan", "--format", "json", "--no-summary", str(root)])
    return json.loads(capsys.readouterr().out)


def test_dry_run_shows_the_unsafe_fix_and_writes_nothing(saved: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    root = cut_config(saved, tmp_path / "m")
    before = snapshot(root)
    [finding] = [f for f in scan(capsys, root)["findings"] if f["code"] == "CG124"]
    assert finding["fix"]["safety"] == "unsafe" and finding["fix"]["flag"] == "--unsafe-fixes"
    assert finding["fix"]["action"] == "config-field"
    code, text = fix_run(capsys, str(root))
    assert code == 1  # something can be fixed (with its flag)
    assert "[unsafe, needs --unsafe-fixes] config-field (CG124): set num_hidden_layers: 3 in config.json" in text
    assert "num_hidden_layers: 2 -> 3" in text  # the value, with its line
    assert "nothing written (dry run)" in text
    code, out = fix_run(capsys, str(root), fmt="json")
    [planned] = json.loads(out)["extra"]["fix"]["plan"]
    assert planned["safety"] == "unsafe" and not planned["enabled"] and planned["waiting_for"] == "--unsafe-fixes"
    assert snapshot(root) == before  # bytes unchanged


def test_write_without_the_flag_does_not_apply_it_and_says_why(saved: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    root = cut_config(saved, tmp_path / "m")
    before = snapshot(root)
    _, text = fix_run(capsys, "--write", str(root))
    assert "[unsafe, needs --unsafe-fixes]" in text and "fixed:" not in text
    assert "not applied without --unsafe-fixes: an unsafe fix is shown, never applied unasked" in text
    _, out = fix_run(capsys, "--write", str(root), fmt="json")
    fix = json.loads(out)["extra"]["fix"]
    [planned] = fix["plan"]
    assert not planned["enabled"] and planned["waiting_for"] == "--unsafe-fixes" and fix["outcomes"] == []
    assert snapshot(root) == before


def test_unsafe_fixes_applies_it_and_transformers_loads_every_tensor(saved: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    root = cut_config(saved, tmp_path / "m")
    _, info = transformers.LlamaForCausalLM.from_pretrained(root, output_loading_info=True)
    assert any(".layers.2." in k for k in info["unexpected_keys"])  # the defect, as transformers sees it
    weights = (root / "model.safetensors").read_bytes()
    code, out = fix_run(capsys, "--write", "--unsafe-fixes", str(root), fmt="json")
    report = json.loads(out)
    [outcome] = report["extra"]["fix"]["outcomes"]
    assert outcome["ok"], outcome
    assert {f["code"] for f in report["findings"]} & {"CG123", "CG124", "CG125"} == set()  # the re-scan
    assert code == 0
    # one token changed back: the file is byte for byte the one save_pretrained wrote; no backup beside it
    assert (root / "config.json").read_bytes() == (saved / "config.json").read_bytes()
    assert (root / "model.safetensors").read_bytes() == weights
    assert not list(root.glob("*.orig")) and not list(root.glob(".ckpt-guard-fix-*"))
    model, info = transformers.LlamaForCausalLM.from_pretrained(root, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"] and not info["mismatched_keys"]
    assert model.config.num_hidden_layers == 3


def test_a_layer_missing_a_tensor_gets_no_fix(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Layers 0..2 in the file, layer 1 without its up_proj: setting 3 would not make the weights whole."""
    root = cut_config(saved, tmp_path / "m")
    state = load_file(root / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    report = scan(capsys, root)
    by_code = {f["code"]: f for f in report["findings"]}
    assert {"CG123", "CG124"} <= set(by_code)
    assert not by_code["CG124"]["fix"]["available"]
    assert "num_hidden_layers: 3" in by_code["CG124"]["fix"]["description"]  # shown, not planned
    assert "layers are not whole" in by_code["CG124"]["fix"]["description"]
    before = snapshot(root)
    code, out = fix_run(capsys, "--write", "--unsafe-fixes", str(root), fmt="json")
    plan = json.loads(out)["extra"]["fix"]
    assert plan["plan"] == [] and plan["outcomes"] == []
    reasons = {u["code"]: u["reason"] for u in plan["unfixable"]}
    # missing weights: no fix, and where the tensors should come from
    assert reasons["CG123"].startswith("no mechanical fix: the weights are not in this checkpoint")
    assert "Take them from the run or the checkpoint that was saved" in reasons["CG123"]
    assert snapshot(root) == before


def test_layers_with_a_gap_get_no_fix(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Layers 0, 1 and 3 (no 2): not 0..M-1, so no count loads them."""
    root = cut_config(saved, tmp_path / "m")
    state = load_file(root / "model.safetensors")
    state = {k.replace("model.layers.2.", "model.layers.3."): v for k, v in state.items()}
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    [finding] = [f for f in scan(capsys, root)["findings"] if f["code"] == "CG124"]
    assert not finding["fix"]["available"] and finding["fix"]["description"].startswith("no mechanical fix")
    before = snapshot(root)
    _, out = fix_run(capsys, "--write", "--unsafe-fixes", str(root), fmt="json")
    assert json.loads(out)["extra"]["fix"]["plan"] == []
    assert snapshot(root) == before
