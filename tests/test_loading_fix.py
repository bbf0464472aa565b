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


# Beyond Llama: per-expert MoE layers (merged into the fused parameters they load as), T5's two stacks,
# and configs that list each layer's kind (layer_types: Qwen2/3, Gemma 2/3, gpt-oss), made as long as the count.
def _fixed(capsys: pytest.CaptureFixture[str], root: Path) -> dict:
    code, out = fix_run(capsys, "--write", "--unsafe-fixes", str(root), fmt="json")
    report = json.loads(out)
    [outcome] = report["extra"]["fix"]["outcomes"]
    assert outcome["ok"], outcome
    assert {f["code"] for f in report["findings"]} & {"CG123", "CG124", "CG125"} == set()  # the re-scan
    return report


def _loads_every_tensor(root: Path, class_name: str) -> None:
    _, info = getattr(transformers, class_name).from_pretrained(root, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"] and not info["mismatched_keys"], info


@pytest.mark.parametrize(("model_type", "edited"), [
    *[(m, "count and layer_types") for m in ("qwen3_moe", "mixtral", "deepseek_v3", "t5", "qwen3", "gemma2", "gemma3",
                                              "gpt_oss")],
    *[(m, "count alone") for m in ("qwen3", "gemma2", "gemma3", "gpt_oss")],  # layer_types left as written
])
def test_extra_layers_fixed_beyond_llama(tmp_path: Path, capsys: pytest.CaptureFixture[str], model_type: str,
                                         edited: str) -> None:
    """save_pretrained's 3 layers, the config cut to 2 (per-expert experts, T5's encoder and decoder, a
    layer_types list cut with the count, or left as written): the fix restores config.json byte for byte.
    Gemma 2 and gpt-oss alternate sliding and full layers: two entries left do not show the pattern twice,
    so the kind of the third is not mechanical, and the fix is shown only."""
    from test_loading import MODELS

    class_name, kwargs, _ = MODELS[model_type]
    kwargs = dict(kwargs)
    if "text_config" in kwargs:
        kwargs["text_config"] = dict(kwargs["text_config"], num_hidden_layers=3)  # type: ignore[call-overload]  # a dict of the test's
    else:
        kwargs["num_layers" if model_type == "t5" else "num_hidden_layers"] = 3
    torch.manual_seed(0)
    config = transformers.CONFIG_MAPPING[model_type](**kwargs)
    if "topk_method" in config.to_dict():
        config.topk_method = "greedy"
    root = tmp_path / model_type
    getattr(transformers, class_name)(config).save_pretrained(root)
    written = (root / "config.json").read_bytes()
    config = json.loads(written)
    assert written.decode() == json.dumps(config, indent=2, sort_keys=True) + "\n"  # save_pretrained's form
    held = config.get("text_config", config)  # a multimodal model: its language model's layers
    lists = "layer_types" in held
    assert lists or edited != "count alone"
    for count in ("num_hidden_layers", "num_layers", "num_decoder_layers"):
        if count in held:
            held[count] -= 1  # T5: both stacks
    if lists and edited != "count alone":
        held["layer_types"] = held["layer_types"][:-1]
    (root / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    [finding] = [f for f in scan(capsys, root)["findings"] if f["code"] == "CG124"]
    if edited != "count alone" and model_type in ("gemma2", "gpt_oss"):
        assert held["layer_types"] == ["sliding_attention", "full_attention"]
        assert not finding["fix"]["available"]
        assert "does not repeat one kind or a pattern seen twice" in finding["fix"]["description"]
        return
    assert finding["fix"]["available"] and finding["fix"]["safety"] == "unsafe", finding["fix"]
    report = _fixed(capsys, root)
    if lists and edited != "count alone":
        assert "layer_types: 2 -> 3 entries" in report["extra"]["fix"]["outcomes"][0]["summary"]
    assert (root / "config.json").read_bytes() == written
    _loads_every_tensor(root, class_name)


def _qwen3(root: Path, types: list[str]) -> Path:
    config = transformers.Qwen3Config(**dict(SMALL, num_hidden_layers=len(types), head_dim=8), layer_types=types,
                                      sliding_window=16, use_sliding_window=True)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(root)
    return root


def _cut(root: Path) -> None:
    config = json.loads((root / "config.json").read_text())
    config["num_hidden_layers"] -= 1
    config["layer_types"] = config["layer_types"][:-1]
    (root / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def test_layer_types_continued_where_a_pattern_is_seen_twice(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Five layers, sliding and full in turn: cut to four, the pattern is seen twice and layer 4 is sliding."""
    s, f = "sliding_attention", "full_attention"
    root = _qwen3(tmp_path / "q", [s, f, s, f, s])
    _cut(root)
    _fixed(capsys, root)
    config = json.loads((root / "config.json").read_text())
    assert config["num_hidden_layers"] == 5 and config["layer_types"] == [s, f, s, f, s]
    _loads_every_tensor(root, "Qwen3ForCausalLM")


def test_layer_types_not_mechanical_is_shown_with_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three layers (sliding, full, full) cut to two: which kind the third layer is, the list cannot say."""
    root = _qwen3(tmp_path / "q", ["sliding_attention", "full_attention", "full_attention"])
    _cut(root)
    [finding] = [f for f in scan(capsys, root)["findings"] if f["code"] == "CG124"]
    assert not finding["fix"]["available"]
    assert "num_hidden_layers: 3" in finding["fix"]["description"]
    assert "layer_types does not repeat one kind or a pattern seen twice" in finding["fix"]["description"]
    before = snapshot(root)
    _, out = fix_run(capsys, "--write", "--unsafe-fixes", str(root), fmt="json")
    assert json.loads(out)["extra"]["fix"]["plan"] == []
    assert snapshot(root) == before


def test_layer_types_longer_than_the_file_is_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three layers in the file, config.json saying 2 with four layer_types: both made 3, the list cut."""
    f = "full_attention"
    root = _qwen3(tmp_path / "q", [f, f, f])
    written = (root / "config.json").read_bytes()
    config = json.loads(written)
    config["num_hidden_layers"], config["layer_types"] = 2, [f] * 4
    (root / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    report = _fixed(capsys, root)
    assert "layer_types: 4 -> 3 entries" in report["extra"]["fix"]["outcomes"][0]["summary"]
    assert (root / "config.json").read_bytes() == written
    _loads_every_tensor(root, "Qwen3ForCausalLM")
