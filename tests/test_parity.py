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
from guard.parity.metrics import TOLERANCES, compare_output, judge  # noqa: E402
from guard.parity.relative import RULES, RelativeRule, judge_low_precision, low_precision_outputs  # noqa: E402
from guard.parity.run import run_parity  # noqa: E402

# transformers' own Flax classes write the Flax side and run in this process: transformers 4 (`.venv-tf4`)
pytestmark = pytest.mark.transformers4
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
def test_bf16_mistral_is_judged_against_pytorchs_own_bf16_error(models: Any) -> None:
    pt_dir, flax_dir = models("mistral", torch.bfloat16)
    findings, fig = run_parity(pt_dir, flax_dir)
    assert findings == [], [f.message for f in findings]
    assert fig["stored_dtype"] == {"torch": "BF16", "flax": "BF16"}
    names = [c["name"] for c in fig["comparisons"]]
    assert names == ["fp32", "flax vs fp32 reference", "torch vs fp32 reference", "stored dtype"]
    by_name = {c["name"]: c for c in fig["comparisons"]}
    assert [c["judged"] for c in fig["comparisons"]] == [True, True, False, False]
    assert by_name["fp32"]["outputs"]["logits"]["max_rel"] <= 1e-5  # the bf16 weights upcast exactly
    low = by_name["flax vs fp32 reference"]
    assert low["tolerance"] == {"rule": "relative", "dtype": "BF16", "factor": RULES["BF16"].factor,
                                "floor": RULES["BF16"].floor, "agreement_floor": RULES["BF16"].agreement_floor,
                                "source": RULES["BF16"].source}
    logits, own = low["outputs"]["logits"], by_name["torch vs fp32 reference"]["outputs"]["logits"]
    assert 0 < logits["max_rel"] <= logits["bound"] and logits["own_max_rel"] == own["max_rel"] > 0
    assert logits["ratio"] == pytest.approx(logits["max_rel"] / own["max_rel"])
    assert logits["bound"] == pytest.approx(RULES["BF16"].factor * own["max_rel"] + RULES["BF16"].floor)
    assert logits["top1_tie_aware"] >= logits["own_top1_tie_aware"] - RULES["BF16"].agreement_floor


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
    same = compare_output("hidden_states.0", ref, np.array([[1.0, np.nan, 3.0]]), tie=1e-5)
    assert same["max_abs"] == 0.0 and same["nonfinite_mismatch"] == 0
    other = compare_output("hidden_states.0", ref, np.array([[1.0, 2.0, np.inf]]), tie=1e-5)
    assert other["nonfinite_mismatch"] == 2 and other["max_abs"] == 0.0
    assert [f[1] for f in judge({"h": other}, TOLERANCES["F32"])] == ["nonfinite_mismatch"]


def test_top1_counts_near_ties_as_agreement() -> None:
    ref = np.array([[[1.0, 0.9999, 0.0], [0.0, 5.0, 1.0]]])
    flipped = np.array([[[0.9999, 1.0, 0.0], [0.0, 5.0, 1.0]]])
    figures = compare_output("logits", ref, flipped, tie=4e-2)
    assert figures["top1"] == 0.5 and figures["top1_tie_aware"] == 1.0


def test_shape_mismatch_fails_and_nhwc_is_transposed() -> None:
    nchw = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    assert compare_output("h", nchw, nchw.transpose(0, 2, 3, 1), tie=1e-5)["max_abs"] == 0.0
    figures = compare_output("h", nchw, np.zeros((1, 5)), tie=1e-5)
    assert judge({"h": figures}, TOLERANCES["F32"])[0][1] == "shape"


# ------------------------------------------------- the low-precision rule, numpy only

RULE = RelativeRule("BF16", factor=4.0, floor=1e-3, agreement_floor=0.05, source="test")


def low(ref: Any, flax: Any, torch_side: Any, name: str = "hidden_states.1") -> list[tuple[str, str, float, float]]:
    outputs = low_precision_outputs({name: ref}, {name: flax}, {name: torch_side}, RULE)
    return judge_low_precision(outputs, RULE)


def test_flax_error_is_judged_by_a_factor_of_pytorchs_own() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 8, 16))
    own = ref + 0.01 * rng.standard_normal(ref.shape)
    assert low(ref, ref + 0.03 * rng.standard_normal(ref.shape), own) == []  # ~3x PyTorch's own
    [(name, metric, value, bound)] = low(ref, ref + 0.2 * rng.standard_normal(ref.shape), own)
    assert (name, metric) == ("hidden_states.1", "max_rel") and value > bound
    figures = low_precision_outputs({"h": ref}, {"h": ref}, {"h": own}, RULE)["h"]
    assert figures["ratio"] == 0.0 and figures["bound"] == pytest.approx(RULE.factor * figures["own_max_rel"] + 1e-3)


def test_where_pytorch_is_exact_the_floor_decides() -> None:
    ref = np.linspace(-1, 1, 32).reshape(2, 16)
    assert low(ref, ref + 5e-4, ref) == []
    assert [f[1] for f in low(ref, ref + 5e-3, ref)] == ["max_rel"]
    assert low_precision_outputs({"h": ref}, {"h": ref + 5e-3}, {"h": ref}, RULE)["h"]["ratio"] is None


def test_flax_may_not_overflow_where_pytorch_does_not() -> None:
    ref = np.ones((2, 4))
    inf = ref.copy()
    inf[0, 0] = np.inf
    assert [f[1] for f in low(ref, inf, ref)] == ["nonfinite_mismatch"]
    assert low(ref, inf, inf) == []  # PyTorch overflows there too: a fact of the dtype, not of the conversion


def test_discrete_outputs_are_judged_by_agreement_not_max_rel() -> None:
    rng = np.random.default_rng(1)
    codes = rng.standard_normal((4, 16))  # the codevectors a quantizer picks from
    picks = rng.integers(0, 4, 400)
    ref = codes[picks][None]
    flipped = picks.copy()
    flipped[:8] = (flipped[:8] + 1) % 4  # 2% of the frames pick another code: max_rel ~ 1
    own = picks.copy()
    own[:6] = (own[:6] + 1) % 4
    name = "projected_quantized_states"
    assert low(ref, codes[flipped][None], codes[own][None], name) == []
    many = picks.copy()
    many[:120] = (many[:120] + 1) % 4  # 30%: far beyond PyTorch's own 1.5%
    [(output, metric, value, bound)] = low(ref, codes[many][None], codes[own][None], name)
    assert (output, metric) == (name, "disagreement") and value == pytest.approx(0.3) and bound < 0.2


def test_top1_disagreement_is_judged_against_pytorchs_own() -> None:
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((1, 64, 10)) * 3
    swapped = ref.copy()
    swapped[0, :32] = swapped[0, :32, ::-1]  # half the rows now pick another label
    failures = low(ref, swapped, ref, "logits")
    assert {f[1] for f in failures} == {"max_rel", "top1_disagreement"}
    assert low(ref, ref, ref, "logits") == []


def test_reports_show_flax_error_pytorchs_own_and_their_ratio_per_output() -> None:
    """Text, markdown and JSON all say why a bf16 model passed or failed, output by output."""
    from guard.parity.verdict import compare_runs, comparison_findings
    from guard.report import Report
    from guard.reporters import render

    rng = np.random.default_rng(0)
    ref = {"logits": rng.standard_normal((2, 4, 9)) * 3, "hidden_states.1": rng.standard_normal((2, 4, 8))}
    torch_low = {k: v + 0.01 * rng.standard_normal(v.shape) for k, v in ref.items()}
    flax_low = dict(torch_low, **{"hidden_states.1": ref["hidden_states.1"] + 0.5})  # far beyond 8x
    runs = {"torch:fp32": ref, "flax:fp32": ref, "torch:stored": torch_low, "flax:stored": flax_low}
    comparisons = compare_runs(runs, {"torch": "BF16", "flax": "BF16"}, layers=2)
    [finding] = comparison_findings(comparisons, where="flax")
    assert finding.code == "CG302" and "'hidden_states.1'" in finding.message and "PyTorch's own" in finding.message
    figures = {"torch_dir": "pt", "flax_dir": "flax", "seed": 0, "torch_class": "X", "flax_class": "FlaxX",
               "comparisons": comparisons}
    report = Report(findings=[finding], policy={"fail_on": "error"}, extra={"parity": figures})
    low = comparisons[1]["outputs"]["hidden_states.1"]
    text = render(report, "text")
    row = next(line for line in text.splitlines() if line.strip().startswith("hidden_states.1"))
    assert f"{low['max_rel']:.2e}" in row and f"{low['own_max_rel']:.2e}" in row and f"{low['ratio']:.3g}" in row
    assert row.rstrip().endswith("FAIL")
    markdown = render(report, "markdown")
    assert "### Parity" in markdown and "| hidden\\_states.1 |" in markdown  # escaped as every cell is
    assert f"| {low['ratio']:.3g} |" in markdown
    assert json.loads(render(report, "json"))["extra"]["parity"]["comparisons"][1]["outputs"]["hidden_states.1"][
        "ratio"] == pytest.approx(low["ratio"])


# ---------------------------------------------------------------- the JAX side's backend and precision drift


@pytest.mark.slow
def test_backend_is_reported_and_drift_only_when_asked_on_the_cpu(models: Any, tmp_path: Path) -> None:
    import jax

    pt_dir, flax_dir = models("mistral")
    _, plain = run_parity(pt_dir, flax_dir)
    assert plain["jax_backend"] == jax.default_backend() == "cpu" and plain["jax_device"]
    assert "default_precision_drift" not in plain  # the CPU computes the same at either precision
    out = tmp_path / "parity.json"
    assert main(["parity", str(pt_dir), str(flax_dir), "--drift", "-f", "json", "-o", str(out)]) == 0
    figures = json.loads(out.read_text())["extra"]["parity"]
    drift = figures["default_precision_drift"]
    assert drift["output"] == "logits" and drift["precision"] == "default"
    # on the CPU the default precision is full fp32: the rerun is the same computation
    assert drift["vs_highest"] == 0.0
    assert drift["vs_torch_fp32"] == drift["highest_vs_torch_fp32"] <= 1e-5
    text = tmp_path / "parity.txt"
    assert main(["parity", str(pt_dir), str(flax_dir), "--drift", "-o", str(text)]) == 0
    assert "JAX on cpu" in text.read_text() and "reported, not judged" in text.read_text()


def test_drift_is_measured_at_the_default_precision_and_never_judged() -> None:
    from guard.parity.accelerator import default_precision_drift

    seen: list[str] = []

    def rerun() -> dict[str, Any]:
        import jax

        seen.append(str(jax.config.jax_default_matmul_precision))
        return {"logits": np.array([1.0, 2.0, 4.02]), "hidden_states.0": np.zeros(3)}

    ref = {"logits": np.array([1.0, 2.0, 4.0])}
    drift = default_precision_drift(rerun, {"logits": np.array([1.0, 2.0, 4.0])}, ref)
    assert seen == ["default"]
    assert drift["vs_torch_fp32"] == pytest.approx(0.005) and drift["vs_highest"] == pytest.approx(0.005)
    assert drift["highest_vs_torch_fp32"] == 0.0
