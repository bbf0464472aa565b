"""`parity SRC --against maxtext` and `convert --to maxtext --parity`: MaxText's own loader and forward.

The checkpoint is converted first (the converter's tree is checked against MaxText's own hooks in
test_convert_maxtext.py); MaxText 0.2.5 then loads it with ``load_parameters_path`` in its Python 3.12
venv (`make maxtext-venv`), through the worker protocol.  Observed on a CPU: every parameter is the file's
after the mapping (bit-exact under ``weight_dtype=bfloat16``, widened exactly under base.yml's float32);
fp16 norms in a bf16 file are rounded to bf16 under ``weight_dtype=bfloat16``; MaxText's forward agrees
with PyTorch to ~2e-7 in fp32, and attends globally where a Mistral's sliding window would not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("orbax.checkpoint")
import torch  # noqa: E402
from test_convert import _offline  # noqa: E402,F401
from test_convert_maxtext import MAXTEXT_PYTHON, MAXTEXT_ROPE, build  # noqa: E402

from guard.cli import main  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


def needs_maxtext() -> None:
    if not MAXTEXT_PYTHON.is_file():
        pytest.skip("MaxText's environment is not built (make maxtext-venv: Python 3.12, maxtext[tpu]==0.2.5)")


def report_of(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text())


# ---- the tree comparison, without MaxText: what the converter wrote, read back as MaxText would hold it ----

@pytest.mark.parametrize("scan", [False, True])
def test_maxtext_tree_is_the_file_after_the_mapping(tmp_path: Path, scan: bool) -> None:
    from functools import partial

    from guard.against.maxtext_tree import compare_maxtext_tree
    from guard.against.run import _file_tensors
    from guard.against.targets import TARGETS
    from guard.convert.maxtext.ocdbt import ItemsReader, read_custom

    src = build("mixtral", tmp_path / "src")
    assert main(["convert", str(src), "--to", "maxtext", "--out", str(tmp_path / "mt"),
                 *(["--scan-layers"] if scan else [])]) == 0
    items = tmp_path / "mt" / "0" / "items"
    reader = ItemsReader(items)
    keys = [tuple(k.strip("()").replace("'", "").split(", ")) for k in json.loads((items / "_METADATA").read_text())
            ["tree_metadata"]]
    held = {"/".join(k[2:]): partial(reader.read, k) for k in keys}
    target = TARGETS["maxtext"]
    findings, figures = compare_maxtext_tree(target, "defaults", None, items, _file_tensors(src), held, where="m")
    assert findings == [] and figures["exact"] == len(keys) and figures["scan_layers"] is scan
    assert read_custom(items)["row"] == figures["row"] == "mixtral"
    # one changed element of one expert: a CG302 naming the HF tensor the leaf starts with
    name = "decoder/layers/MoeBlock_0/wo" if scan else "decoder/layers_1/MoeBlock_0/wo"
    changed = held[name]().copy()
    changed.reshape(-1)[5] = changed.reshape(-1)[5] * 2 + 1
    held[name] = lambda: changed
    del held["decoder/decoder_norm/scale"]
    findings, figures = compare_maxtext_tree(target, "bfloat16 weights", "weight_dtype=float32", items,
                                             _file_tensors(src), held, where="m")
    assert sorted((f.code, f.tensor) for f in findings) == [
        ("CG302", f"model.layers.{0 if scan else 1}.block_sparse_moe.experts.0.w2.weight"),
        ("CG304", "model.norm.weight")]
    cg302 = next(f for f in findings if f.code == "CG302")
    assert "1 of" in cg302.message and "weight_dtype=float32 avoids it" in cg302.message


def test_requirements_are_known_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    src = build("qwen3", tmp_path / "src")
    out = tmp_path / "mt"
    assert main(["convert", str(src), "--to", "maxtext", "--out", str(out), "--parity", "--dtype", "fp32"]) == 2
    assert "--parity" in capsys.readouterr().err and not out.exists()
    monkeypatch.setenv("CKPT_GUARD_HOME", str(tmp_path / "envs"))  # no MaxText environment there
    assert main(["convert", str(src), "--to", "maxtext", "--out", str(out), "--parity"]) == 2
    err = capsys.readouterr().err
    assert "ckpt-guard env install maxtext" in err and "nothing written" in err and not out.exists()
    assert main(["parity", str(src), "--against", "maxtext", "-o", str(tmp_path / "r.json")]) == 2
    assert "ckpt-guard env install maxtext" in capsys.readouterr().err and not (tmp_path / "r.json").exists()


def test_an_architecture_maxtext_has_no_row_for_is_cg303(tmp_path: Path) -> None:
    import transformers as tf

    src = tmp_path / "src"
    config = tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    tf.GPT2LMHeadModel(config).save_pretrained(src)
    assert main(["parity", str(src), "--against", "maxtext", "--format", "json", "-o", str(tmp_path / "r.json")]) == 0
    report = report_of(tmp_path / "r.json")
    assert [f["code"] for f in report["findings"]] == ["CG303"] and "gpt2" in report["findings"][0]["message"]


# ---- MaxText itself ----

def test_bf16_passes_and_fp16_norms_are_named_with_the_option(tmp_path: Path) -> None:
    """A bf16 Qwen3 whose norms are fp16: base.yml's weight_dtype=float32 holds them exactly (and the bf16 file
    bit-exactly widened), weight_dtype=bfloat16 rounds every norm: CG302 on each, naming the option that avoids it."""
    needs_maxtext()
    from safetensors.torch import load_file, save_file

    src = build("qwen3", tmp_path / "src")
    path = src / "model.safetensors"
    save_file({k: (v.to(torch.float16) if "norm" in k else v) for k, v in load_file(path).items()}, path,
              metadata={"format": "pt"})
    report_path = tmp_path / "r.json"
    code = main(["parity", str(src), "--against", "maxtext", "--format", "json", "-o", str(report_path)])
    report = report_of(report_path)
    parity = report["extra"]["parity"]
    assert parity["against"] == "maxtext" and parity["conversion"]["scan_layers"] is True
    defaults, bf16 = parity["loads"]["defaults"]["tree"], parity["loads"]["bfloat16 weights"]["tree"]
    assert defaults["changed"] == [] and defaults["missing"] == [] and defaults["extra"] == []
    assert len(defaults["widened"]) == 14  # every scanned leaf of the file widened exactly to float32
    assert {c["library_name"] for c in bf16["changed"]} == {
        "decoder/decoder_norm/scale", "decoder/layers/pre_self_attention_layer_norm/scale",
        "decoder/layers/post_self_attention_layer_norm/scale", "decoder/layers/self_attention/query_norm/scale",
        "decoder/layers/self_attention/key_norm/scale"}
    tree_errors = [f for f in report["findings"] if f["code"] == "CG302" and "forward" not in f["message"]]
    assert {f["tensor"] for f in tree_errors} == {
        "model.norm.weight", "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"}
    assert all("rounded float16 -> bfloat16" in f["message"] and "weight_dtype=float32 (base.yml's default) avoids it"
               in f["message"] for f in tree_errors)
    assert code == 1
    fp32 = [c for c in parity["comparisons"] if c["name"].startswith("defaults") and c["judged"]]
    assert fp32 and all(c["passed"] for c in fp32)  # the defaults load's forward passes, fp32 and bf16


@pytest.mark.parametrize("kind", ["llama3", "mistral"])
def test_fp32_forward_and_a_sliding_window_maxtext_ignores(tmp_path: Path, kind: str) -> None:
    """fp32 Llama 3 passes (its query-scale rounding declared, CG301); a Mistral with a sliding window shorter than
    the inputs fails MaxText's forward (its mistral block attends globally): CG302 naming MaxText."""
    needs_maxtext()
    src = build(kind, tmp_path / "src", torch.float32, rope=MAXTEXT_ROPE)
    if kind == "mistral":
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "sliding_window": 4}))
    report_path = tmp_path / "r.json"
    code = main(["parity", str(src), "--against", "maxtext", "--format", "json", "-o", str(report_path)])
    report = report_of(report_path)
    codes = sorted({f["code"] for f in report["findings"]})
    tree = report["extra"]["parity"]["loads"]["defaults"]["tree"]
    assert tree["changed"] == [] and tree["exact"] == 12  # fp32 held as fp32: every scanned leaf bit-exact
    if kind == "llama3":
        assert code == 0 and codes == ["CG301"], report["findings"]
        assert report["findings"][0]["severity"] == "warning"
    else:
        assert code == 1 and codes == ["CG301", "CG302"]  # Mistral's query is scaled too: declared
        assert all(f["message"].startswith("maxtext 0.2.5 (defaults") and "forward" in f["message"]
                   for f in report["findings"] if f["code"] == "CG302")


def test_convert_parity_runs_maxtexts_forward_on_the_output(tmp_path: Path) -> None:
    needs_maxtext()
    src = build("qwen3", tmp_path / "src", torch.float32)
    out, report_path = tmp_path / "mt", tmp_path / "r.json"
    assert main(["convert", str(src), "--to", "maxtext", "--out", str(out), "--parity", "--format", "json", "-o",
                 str(report_path)]) == 0
    report = report_of(report_path)
    parity = report["extra"]["parity"]
    assert report["extra"]["conversion"]["written"] and parity["passed"] is True and "conversion" not in parity
    assert parity["loads"]["defaults"]["tree"]["exact"] == 25  # unscanned, as written
    fp32 = next(c for c in parity["comparisons"] if c["name"].startswith("defaults") and c["judged"])
    assert fp32["passed"] and report["findings"] == []


def test_maxtext_tied_logit_conventions_named_where_they_apply() -> None:
    from test_convert_maxtext import EMBED_STEPS

    from guard.against.maxtext_causes import embed_step, forward_causes

    gemma3 = {"model_type": "gemma3_text"}  # tied by default, as transformers' Gemma configs are
    assert len(forward_causes(gemma3, {}, "F32")) == 2 and forward_causes(gemma3, {}, "BF16") == ()
    (table,) = forward_causes({"model_type": "llama", "tie_word_embeddings": True}, {}, "F32")
    assert "attend_on_embedding" in table and "no flag avoids it" in table
    assert forward_causes({"model_type": "llama"}, {}, "F32") == ()  # untied: no logits from the table
    # the conventional reference scales the table as the conversion's row does
    assert embed_step({"model_type": "gemma3_text"}) == EMBED_STEPS["gemma3"]
    assert embed_step({"model_type": "gemma2"}) == EMBED_STEPS["gemma2"]
    assert embed_step({"model_type": "llama"}) is None


def test_an_fp32_gemma3_misses_only_by_maxtexts_declared_conventions(tmp_path: Path) -> None:
    """A tiny fp32 Gemma 3: every leaf MaxText holds is exact (its embedding after the declared bf16 scale,
    CG301); its fp32 forward misses transformers' plain logits by ~2e-3, and agrees with transformers' forward
    carrying MaxText's two conventions: a warning naming them, and the run passes. With --drift, MaxText's
    fp32 forward at its default matmul precision is a figure."""
    needs_maxtext()
    src = build("gemma3", tmp_path / "src", torch.float32)
    report_path = tmp_path / "r.json"
    code = main(["parity", str(src), "--against", "maxtext", "--drift", "--format", "json", "-o", str(report_path)])
    report = report_of(report_path)
    assert code == 0, report["findings"]
    parity = report["extra"]["parity"]
    assert parity["loads"]["defaults"]["tree"]["changed"] == [] and parity["passed"] is True
    forward = [f for f in report["findings"] if f["code"] == "CG302"]
    assert forward and all(f["severity"] == "warning" and "attend_on_embedding" in f["message"]
                           and "bf16(sqrt(hidden_size))" in f["message"] and "nothing else" in f["message"]
                           for f in forward), forward
    assert {f["code"] for f in report["findings"]} == {"CG301", "CG302"}
    by_name = {c["name"]: c for c in parity["comparisons"]}
    plain, conventional = by_name["defaults: fp32"], by_name["defaults: fp32 with maxtext's conventions"]
    assert not plain["passed"] and plain["outputs"]["logits"]["max_rel"] > 1e-4
    assert conventional["passed"] and conventional["outputs"]["logits"]["max_rel"] < 1e-5
    # --drift: MaxText built again at base.yml's matmul_precision; on the CPU that computes what 'highest' does
    drift = parity["loads"]["defaults"]["default_precision_drift"]
    assert drift["precision"] == "default" and drift["vs_highest"] <= 1e-6


def test_a_tied_model_that_misses_by_more_than_the_conventions_is_still_an_error(tmp_path: Path) -> None:
    """The defect planted: a tied Mistral whose sliding window (4) is shorter than the inputs, which MaxText's
    mistral block ignores. Its fp32 forward misses the conventional reference too: CG302, an error."""
    needs_maxtext()
    src = build("mistral_tied", tmp_path / "src", torch.float32)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "sliding_window": 4}))
    report_path = tmp_path / "r.json"
    code = main(["parity", str(src), "--against", "maxtext", "--format", "json", "-o", str(report_path)])
    report = report_of(report_path)
    assert code == 1, report["findings"]
    forward = [f for f in report["findings"] if f["code"] == "CG302" and "fp32 (" in f["message"]]
    assert forward and all(f["severity"] == "error" and "something else differs" in f["message"]
                           and "attend_on_embedding" in f["message"] for f in forward), forward
    conventional = next(c for c in report["extra"]["parity"]["comparisons"] if "conventions" in c["name"])
    assert not conventional["passed"]
