"""The parity smoke test on tiny models whose Flax weights transformers itself wrote."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
serialization = pytest.importorskip("flax.serialization")
from flax.traverse_util import flatten_dict, unflatten_dict  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.parity.run import run_parity  # noqa: E402
from guard.parity.metrics import TOLERANCES, compare_output, judge  # noqa: E402

T = transformers
TINY = {"vocab_size": 99, "max_position_embeddings": 64}
BUILDERS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "bert": lambda: (T.BertForMaskedLM(T.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **TINY)),
        T.FlaxBertForMaskedLM),
    "gpt2": lambda: (T.GPT2LMHeadModel(T.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64)), T.FlaxGPT2LMHeadModel),
    "mistral": lambda: (T.MistralForCausalLM(T.MistralConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, **TINY)), T.FlaxMistralForCausalLM),
    "bart": lambda: (T.BartForConditionalGeneration(T.BartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, **TINY)), T.FlaxBartForConditionalGeneration),
    "t5": lambda: (T.T5ForConditionalGeneration(T.T5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4)),
        T.FlaxT5ForConditionalGeneration),
    "vit": lambda: (T.ViTForImageClassification(T.ViTConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, num_labels=5)), T.FlaxViTForImageClassification),
}


def build(root: Path, kind: str, *, dtype: Any = None) -> tuple[Path, Path]:
    torch.manual_seed(0)
    model, flax_cls = BUILDERS[kind]()
    if dtype is not None:
        model = model.to(dtype)
    pt_dir, flax_dir = root / "pt", root / "flax"
    model.save_pretrained(pt_dir)
    flax_cls.from_pretrained(pt_dir, from_pt=True).save_pretrained(flax_dir)
    return pt_dir, flax_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path]]:
    cache: dict[tuple[str, str], tuple[Path, Path]] = {}

    def get(kind: str, dtype: Any = None) -> tuple[Path, Path]:
        key = (kind, str(dtype))
        if key not in cache:
            cache[key] = build(tmp_path_factory.mktemp(f"{kind}-{dtype}".replace(".", "_")), kind, dtype=dtype)
        return cache[key]

    return get


def copy_flax(flax_dir: Path, dest: Path, edit: Callable[[dict[tuple[str, ...], Any]], None]) -> Path:
    shutil.copytree(flax_dir, dest)
    path = dest / "flax_model.msgpack"
    flat = flatten_dict(serialization.msgpack_restore(path.read_bytes()))
    flat = {k: np.array(v) for k, v in flat.items()}
    edit(flat)
    path.write_bytes(serialization.msgpack_serialize(unflatten_dict(flat)))
    return dest


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bert", "gpt2", "mistral", "bart", "vit"])
def test_fp32_pairs_pass_within_1e_5_of_output_scale(models: Any, kind: str) -> None:
    findings, fig = run_parity(*models(kind))
    assert findings == [], [f.message for f in findings]
    assert fig["passed"] and fig["available"]
    [fp32] = fig["comparisons"]
    assert fp32["tolerance"]["max_rel"] == 1e-5
    outputs = fp32["outputs"]
    assert any(name.startswith(("logits", "decoder_hidden_states", "hidden_states")) for name in outputs)
    for figures in outputs.values():
        assert figures["max_rel"] <= 1e-5 and figures["cosine"] > 0.99999
        assert {"max_abs", "mean_abs", "max_ref", "nonfinite_mismatch"} <= set(figures)
    if kind != "vit":
        assert outputs["logits"]["top1"] == 1.0


@pytest.fixture
def jnp_clip_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 4.x's Flax T5 calls jnp.clip(a_max=...), which newer jax removed."""
    import jax.numpy as jnp

    clip = jnp.clip

    def shim(x: Any, a_min: Any = None, a_max: Any = None, **kwargs: Any) -> Any:
        return clip(x, min=kwargs.pop("min", a_min), max=kwargs.pop("max", a_max), **kwargs)

    monkeypatch.setattr(jnp, "clip", shim)


@pytest.mark.slow
def test_t5_seq2seq_pair(models: Any, jnp_clip_shim: None) -> None:
    findings, fig = run_parity(*models("t5"))
    assert findings == [], [f.message for f in findings]
    outputs = fig["comparisons"][0]["outputs"]
    assert {"logits", "encoder_last_hidden_state", "decoder_hidden_states.0"} <= set(outputs)
    assert fig["inputs"].keys() == {"input_ids", "attention_mask", "decoder_input_ids"}


@pytest.mark.slow
def test_flax_code_that_cannot_run_is_cg303_not_a_failure(models: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pt_dir, flax_dir = models("bert")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("tanh() got an unexpected keyword argument 'approximate'")

    monkeypatch.setitem(transformers.modeling_flax_utils.ACT2FN, "gelu", broken)
    findings, fig = run_parity(pt_dir, flax_dir)
    assert [f.code for f in findings] == ["CG303"] and fig["available"] is False
    assert "does not run with the installed jax" in findings[0].message


@pytest.mark.slow
def test_bf16_mistral_is_judged_in_bf16_and_against_fp32(models: Any) -> None:
    pt_dir, flax_dir = models("mistral", torch.bfloat16)
    findings, fig = run_parity(pt_dir, flax_dir)
    assert findings == [], [f.message for f in findings]
    assert fig["stored_dtype"] == {"torch": "BF16", "flax": "BF16"}
    names = [c["name"] for c in fig["comparisons"]]
    assert names == ["fp32", "stored dtype", "torch vs fp32 reference", "flax vs fp32 reference"]
    by_name = {c["name"]: c for c in fig["comparisons"]}
    assert by_name["fp32"]["outputs"]["logits"]["max_rel"] <= 1e-5  # the bf16 weights upcast exactly
    stored = by_name["stored dtype"]
    assert stored["tolerance"]["dtype"] == "BF16" and stored["tolerance"]["top1"] == 0.99
    assert 0 < stored["outputs"]["logits"]["max_rel"] <= 4e-2


@pytest.mark.slow
def test_a_perturbed_kernel_fails_with_cg302(models: Any, tmp_path: Path) -> None:
    pt_dir, flax_dir = models("gpt2")

    def perturb(flat: dict[tuple[str, ...], Any]) -> None:
        # random, not a constant: a constant shift after a LayerNorm sums to zero
        key = next(k for k in sorted(flat) if k[-1] == "kernel")
        flat[key] = flat[key] + np.random.default_rng(0).normal(0, 0.01, flat[key].shape).astype(np.float32)

    bad = copy_flax(flax_dir, tmp_path / "bad", perturb)
    findings, fig = run_parity(pt_dir, bad)
    assert [f.code for f in findings] == ["CG302"]
    assert "max_rel" in findings[0].message and "1e-05" in findings[0].message
    assert fig["passed"] is False and fig["comparisons"][0]["failures"]


@pytest.mark.slow
def test_a_missing_flax_parameter_is_cg304(models: Any, tmp_path: Path) -> None:
    pt_dir, flax_dir = models("bert")

    def drop(flat: dict[tuple[str, ...], Any]) -> None:
        del flat[next(k for k in sorted(flat) if k[-1] == "kernel")]

    findings, _fig = run_parity(pt_dir, copy_flax(flax_dir, tmp_path / "bad", drop))
    assert [f.code for f in findings] == ["CG304"]


@pytest.mark.slow
def test_unpaired_model_type_is_a_cg303_note(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = T.Qwen2ForCausalLM(T.Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=37, **TINY))
    model.save_pretrained(tmp_path / "pt")
    shutil.copytree(tmp_path / "pt", tmp_path / "flax")
    findings, fig = run_parity(tmp_path / "pt", tmp_path / "flax")
    assert [(f.code, f.severity.value) for f in findings] == [("CG303", "note")]
    assert fig["available"] is False and "qwen2" in fig["reason"]
    assert main(["parity", str(tmp_path / "pt"), str(tmp_path / "flax")]) == 0  # a note is not a failure


@pytest.mark.parametrize(("config", "code"), [
    ('{"model_type": "no-such-model"}', "CG303"),
    ("{}", "CG303"),
    ("{not json", "CG001"),
])
def test_bad_configs_are_findings(tmp_path: Path, config: str, code: str) -> None:
    for side in ("pt", "flax"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "config.json").write_text(config)
    findings, _fig = run_parity(tmp_path / "pt", tmp_path / "flax")
    assert [f.code for f in findings] == [code]


@pytest.mark.slow
def test_cli_writes_every_figure_to_json(models: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pt_dir, flax_dir = models("gpt2")
    out = tmp_path / "parity.json"
    assert main(["parity", str(pt_dir), str(flax_dir), "--seed", "3", "-f", "json", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    figures = report["extra"]["parity"]
    assert figures["seed"] == 3 and figures["passed"] is True and report["findings"] == []
    assert figures["comparisons"][0]["outputs"]["logits"]["cosine"] > 0.99999
    assert main(["parity", str(pt_dir), str(flax_dir)]) == 0
    assert "passed" in capsys.readouterr().out


def test_cli_refuses_a_missing_directory(tmp_path: Path) -> None:
    assert main(["parity", str(tmp_path / "nope"), str(tmp_path)]) == 2


# ---------------------------------------------------------------- metrics, numpy only


def test_nan_masking_and_nonfinite_mismatch() -> None:
    ref = np.array([[1.0, np.nan, 3.0]])
    same = compare_output("hidden_states.0", ref, np.array([[1.0, np.nan, 3.0]]), TOLERANCES["F32"])
    assert same["max_abs"] == 0.0 and same["nonfinite_mismatch"] == 0
    other = compare_output("hidden_states.0", ref, np.array([[1.0, 2.0, np.inf]]), TOLERANCES["F32"])
    assert other["nonfinite_mismatch"] == 2 and other["max_abs"] == 0.0
    assert [f[1] for f in judge({"h": other}, TOLERANCES["F32"])] == ["nonfinite_mismatch"]


def test_top1_counts_near_ties_as_agreement() -> None:
    ref = np.array([[[1.0, 0.9999, 0.0], [0.0, 5.0, 1.0]]])
    flipped = np.array([[[0.9999, 1.0, 0.0], [0.0, 5.0, 1.0]]])
    figures = compare_output("logits", ref, flipped, TOLERANCES["BF16"])
    assert figures["top1"] == 0.5 and figures["top1_tie_aware"] == 1.0
    far = np.array([[[0.0, 0.0, 3.0], [0.0, 5.0, 1.0]]])
    failures = judge({"logits": compare_output("logits", ref, far, TOLERANCES["BF16"])}, TOLERANCES["BF16"])
    assert {f[1] for f in failures} == {"max_rel", "top1_tie_aware"}


def test_shape_mismatch_fails_and_nhwc_is_transposed() -> None:
    nchw = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    assert compare_output("h", nchw, nchw.transpose(0, 2, 3, 1), TOLERANCES["F32"])["max_abs"] == 0.0
    figures = compare_output("h", nchw, np.zeros((1, 5)), TOLERANCES["F32"])
    assert judge({"h": figures}, TOLERANCES["F32"])[0][1] == "shape"
