"""CG123-CG125 against transformers' own verdict: tiny models its save_pretrained wrote, with defects planted.

For every architecture of the table: the model as saved, its head removed, a layer too many for its
config, a tensor's shape changed, and (MoE) an expert removed, in the fused layout transformers 5
writes and the per-expert layout of the Hub's older checkpoints.  The scan's verdict must agree with
``from_pretrained(output_loading_info=True)``: missing keys <-> CG123, unexpected keys <-> CG124, a size
mismatch (it raises) <-> CG125.  Where transformers is silent and wrong (experts absent from a per-expert
file), the test says so and checks the values it loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from scanning import codes, json_scan  # noqa: E402

from guard.inventory.architectures import table_row  # noqa: E402
from guard.inventory.architectures_table import ARCHITECTURES  # noqa: E402

SMALL = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
             num_hidden_layers=2, max_position_embeddings=64)
MLA = dict(kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
           first_k_dense_replace=1, n_group=1, topk_group=1, moe_intermediate_size=16, n_routed_experts=4,
           num_experts_per_tok=2)

# model_type -> (class, config, (expert container, per-expert gate/up/down names) or None)
MODELS: dict[str, tuple[str, dict[str, object], tuple[str, tuple[str, str, str]] | None]] = {
    "llama": ("LlamaForCausalLM", SMALL, None),
    "mistral": ("MistralForCausalLM", SMALL, None),
    "qwen2": ("Qwen2ForCausalLM", SMALL, None),
    "qwen3": ("Qwen3ForCausalLM", dict(SMALL, head_dim=8), None),
    "gemma": ("GemmaForCausalLM", dict(SMALL, head_dim=8), None),
    "gemma2": ("Gemma2ForCausalLM", dict(SMALL, head_dim=8), None),
    "gemma3_text": ("Gemma3ForCausalLM", dict(SMALL, head_dim=8), None),
    "phi3": ("Phi3ForCausalLM", dict(SMALL, pad_token_id=0), None),
    "gpt_neox": ("GPTNeoXForCausalLM", SMALL, None),
    "falcon": ("FalconForCausalLM", dict(hidden_size=32, num_attention_heads=4, vocab_size=96,
                                         num_hidden_layers=2), None),
    "gpt2": ("GPT2LMHeadModel", dict(n_embd=32, n_head=4, n_layer=2, vocab_size=96, n_positions=64), None),
    "bert": ("BertForMaskedLM", dict(SMALL, pad_token_id=0), None),
    "t5": ("T5ForConditionalGeneration", dict(d_model=32, d_ff=48, d_kv=8, num_heads=4, num_layers=2,
                                              vocab_size=96, decoder_start_token_id=0, pad_token_id=0), None),
    "mixtral": ("MixtralForCausalLM", dict(SMALL, num_local_experts=4),
                ("block_sparse_moe.experts", ("w1", "w3", "w2"))),
    "qwen2_moe": ("Qwen2MoeForCausalLM", dict(SMALL, moe_intermediate_size=16, num_experts=4,
                                              shared_expert_intermediate_size=24),
                  ("mlp.experts", ("gate_proj", "up_proj", "down_proj"))),
    "qwen3_moe": ("Qwen3MoeForCausalLM", dict(SMALL, moe_intermediate_size=16, num_experts=4, head_dim=8),
                  ("mlp.experts", ("gate_proj", "up_proj", "down_proj"))),
    "deepseek_v2": ("DeepseekV2ForCausalLM", dict(SMALL, **MLA), ("mlp.experts", ("gate_proj", "up_proj",
                                                                                  "down_proj"))),
    "deepseek_v3": ("DeepseekV3ForCausalLM", dict(SMALL, **MLA), ("mlp.experts", ("gate_proj", "up_proj",
                                                                                  "down_proj"))),
    "gpt_oss": ("GptOssForCausalLM", dict(SMALL, num_local_experts=4, head_dim=8), None),
    "gemma3": ("Gemma3ForConditionalGeneration", dict(
        text_config=dict(SMALL, head_dim=8, sliding_window=16),
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=95, boi_token_index=93, eoi_token_index=94), None),
}


def test_every_case_has_a_row() -> None:
    # every model_type is in the table (bench/loading_sweep.py scans each class's save); these are judged in full
    assert set(MODELS) | {"qwen2_vl_text"} <= set(ARCHITECTURES)


def save(root: Path, model_type: str, *, tie: bool | None = None) -> Path:
    class_name, kwargs, _ = MODELS[model_type]
    torch.manual_seed(0)
    extra = {} if tie is None else {"tie_word_embeddings": tie}
    config = transformers.CONFIG_MAPPING[model_type](**kwargs, **extra)
    if "topk_method" in config.to_dict():
        config.topk_method = "greedy"
    getattr(transformers, class_name)(config).save_pretrained(root)
    return root


def tensors(root: Path) -> dict[str, torch.Tensor]:
    return load_file(root / "model.safetensors")


def write(root: Path, state: dict[str, torch.Tensor]) -> None:
    save_file({k: v.contiguous() for k, v in state.items()}, root / "model.safetensors", metadata={"format": "pt"})


def edit_config(root: Path, **changes: object) -> None:
    config = json.loads((root / "config.json").read_text())
    config.update(changes)
    (root / "config.json").write_text(json.dumps(config, indent=2))


def fused(root: Path, model_type: str) -> None:
    """The experts as the model holds them (``mlp.experts.gate_up_proj`` [E, 2I, H]): transformers 5 loads these
    names as they are, while its save_pretrained writes the Hub's per-expert layout (its conversion, reversed)."""
    saved = tensors(root)
    model = getattr(transformers, MODELS[model_type][0]).from_pretrained(root)
    kept = {k for k, _ in model.named_parameters()} | {k for k, _ in model.named_buffers()}  # tied aliases once
    state = {k: v for k, v in model.state_dict().items() if k in kept}
    assert state.keys() != saved.keys()  # the layouts differ
    write(root, state)


def transformers_verdict(root: Path, model_type: str) -> set[str]:
    """The codes transformers' own loading says: CG123 missing, CG124 unexpected, CG125 it raised."""
    cls = getattr(transformers, MODELS[model_type][0])
    try:
        _, info = cls.from_pretrained(root, output_loading_info=True)
    except RuntimeError as exc:
        assert "ignore_mismatched_sizes" in str(exc), exc
        return {"CG125"}
    verdict = set()
    if info["missing_keys"]:
        verdict.add("CG123")
    if info["unexpected_keys"]:
        verdict.add("CG124")
    if info["mismatched_keys"]:
        verdict.add("CG125")
    return verdict


def scan_verdict(capsys: pytest.CaptureFixture[str], root: Path) -> set[str]:
    _, report = json_scan(capsys, str(root))
    return codes(report) & {"CG123", "CG124", "CG125", "CG127"}


def plant(root: Path, model_type: str, defect: str) -> None:
    state = tensors(root)
    config = json.loads((root / "config.json").read_text())
    if defect == "head removed":
        head = next(k for k in state if k.endswith(("lm_head.weight", "embed_out.weight",
                                                    "cls.predictions.decoder.weight")))
        del state[head]
    elif defect == "layer added":
        if "text_config" in config:  # a multimodal model: its language model's layers
            text = dict(config["text_config"], num_hidden_layers=config["text_config"]["num_hidden_layers"] - 1)
            text["layer_types"] = text["layer_types"][:-1]
            edit_config(root, text_config=text)
            return
        count = next(k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in config)
        changes = {count: config[count] - 1}
        if "num_decoder_layers" in config:
            changes["num_decoder_layers"] = config["num_decoder_layers"] - 1
        if isinstance(config.get("layer_types"), list):  # a config edited by hand keeps its own checks
            changes["layer_types"] = config["layer_types"][:-1]
        edit_config(root, **changes)
        return
    elif defect == "shape changed":
        name = next(k for k in state if k.endswith(("embed_tokens.weight", "wte.weight", "word_embeddings.weight",
                                                    "embed_in.weight", "shared.weight")))
        state[name] = state[name][:-8]
    elif defect == "expert removed":
        for name in [k for k in state if k.endswith(("experts.gate_up_proj", "experts.down_proj",
                                                     "experts.gate_up_proj_bias", "experts.down_proj_bias"))]:
            state[name] = state[name][:-1]
        for name in [k for k in state if ".experts.3." in k]:
            del state[name]
    write(root, state)


def _cases() -> list[tuple[str, str, str]]:
    out = []
    for model_type, (_, _, experts) in MODELS.items():
        layouts = ["per-expert (as saved)", "fused"] if experts else ["as saved"]
        for layout in layouts:
            defects = ["none", "head removed", "layer added", "shape changed"]
            if model_type == "t5":
                defects.remove("head removed")  # T5's head is shared.weight whatever the config says: no head to lose
            if experts or model_type == "gpt_oss":
                defects.append("expert removed")
            out += [(model_type, layout, d) for d in defects]
    return out


@pytest.mark.parametrize(("model_type", "layout", "defect"), _cases())
def test_verdict_agrees_with_transformers(tmp_path: Path, capsys: pytest.CaptureFixture[str], model_type: str,
                                          layout: str, defect: str) -> None:
    root = save(tmp_path / model_type, model_type, tie=False if defect == "head removed" else None)
    if layout == "fused":
        fused(root, model_type)
    if defect != "none":
        plant(root, model_type, defect)
    ours = scan_verdict(capsys, root)
    theirs = transformers_verdict(root, model_type)
    if layout.startswith("per-expert") and defect == "expert removed":
        # transformers 5.25 merges the experts it finds into a tensor one expert short and refuses its size;
        # the scan names the experts the file lacks (CG123), the error a loader that merged by index would hide
        assert theirs == {"CG125"}
        assert ours == {"CG123"}
        return
    assert ours == theirs, (ours, theirs)


def test_missing_experts_named_and_loaded_random(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: experts 2-3 of 4 left out of a per-expert Qwen3-MoE, which transformers loads silently."""
    root = save(tmp_path / "moe", "qwen3_moe")
    whole = tensors(root)
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in whole  # save_pretrained writes the per-expert layout
    write(root, {k: v for k, v in whole.items() if not any(f".experts.{e}." in k for e in (2, 3))})
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):  # 5.25 refuses the short merged tensor
        transformers.Qwen3MoeForCausalLM.from_pretrained(root)
    model, info = transformers.Qwen3MoeForCausalLM.from_pretrained(root, output_loading_info=True,
                                                                   ignore_mismatched_sizes=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # what it does say: no key is missing
    loaded = model.model.layers[0].mlp.experts.gate_up_proj.detach()
    saved = whole["model.layers.0.mlp.experts.2.gate_proj.weight"]
    assert not torch.equal(loaded[2, : saved.shape[0]], saved)  # experts 2-3: random values, not the weights
    code, report = json_scan(capsys, str(root))
    assert code == 1
    found = [f for f in report["findings"] if f["code"] == "CG123"]
    assert found and all("experts 2–3 of 4 in layers 0–1" in f["message"] for f in found), found
    assert all(f["fix"]["safety"] == "none" for f in found)


def test_untied_head_missing_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = save(tmp_path / "llama", "llama", tie=False)
    write(root, {k: v for k, v in tensors(root).items() if k != "lm_head.weight"})
    _, report = json_scan(capsys, str(root))
    [finding] = [f for f in report["findings"] if f["code"] == "CG123"]
    assert "'lm_head.weight'" in finding["message"] and finding["severity"] == "error"


def test_tied_head_absent_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = save(tmp_path / "llama", "llama", tie=True)
    assert "lm_head.weight" not in tensors(root)  # save_pretrained writes a tied head once
    assert scan_verdict(capsys, root) == set()


def test_extra_layers_warn_and_show_the_config_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = save(tmp_path / "llama", "llama")
    edit_config(root, num_hidden_layers=1)
    code, report = json_scan(capsys, str(root))
    assert code == 0  # a warning: the model loads, one layer short
    [finding] = [f for f in report["findings"] if f["code"] == "CG124"]
    assert "layer 1" in finding["message"] and "num_hidden_layers" in finding["message"]
    assert "num_hidden_layers: 2" in finding["fix"]["description"]
    assert finding["fix"]["safety"] == "unsafe"  # shown, applied only with --unsafe-fixes (test_loading_fix.py)


def test_shape_names_tensor_field_and_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = save(tmp_path / "llama", "llama")
    edit_config(root, vocab_size=100)
    _, report = json_scan(capsys, str(root))
    found = [f for f in report["findings"] if f["code"] == "CG125"]
    assert {f["tensor"] for f in found} == {"model.embed_tokens.weight", "lm_head.weight"}
    assert all("is 96 where config.json's vocab_size gives 100" in f["message"] for f in found)


def test_no_row_is_a_note_never_silence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = save(tmp_path / "llama", "llama")
    # a model_type transformers does not know (remote code): no row, nothing to build it from
    edit_config(root, model_type="not_a_model", architectures=["NotAModelForCausalLM"])
    _, report = json_scan(capsys, str(root))
    [note] = [f for f in report["findings"] if f["code"] == "CG127"]
    assert note["severity"] == "note" and "'not_a_model'" in note["message"]


def test_table_rows_resolve_from_saved_configs(tmp_path: Path) -> None:
    for model_type in ("llama", "qwen3_moe", "deepseek_v3"):
        root = save(tmp_path / model_type, model_type)
        found = table_row(json.loads((root / "config.json").read_text()))
        assert not isinstance(found, str), found


def test_qwen2_vl_text_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = transformers.Qwen2VLTextConfig(**SMALL)
    torch.manual_seed(0)
    model = transformers.Qwen2VLTextModel(config)
    model.save_pretrained(tmp_path / "text")
    assert scan_verdict(capsys, tmp_path / "text") == set()
    state = tensors(tmp_path / "text")
    del state["layers.1.mlp.up_proj.weight"]
    write(tmp_path / "text", state)
    assert scan_verdict(capsys, tmp_path / "text") == {"CG123"}
