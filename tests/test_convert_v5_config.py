"""config.json as transformers 5 writes it, converted for the transformers-4 Flax target (issue 29).

transformers 5 writes `rope_parameters` for `rope_theta`/`rope_scaling` and `dtype` for `torch_dtype`;
4.57 reads such a config with the default theta.  convert writes the keys 4.x reads, refuses what
4.x's Flax classes cannot compute, and parity fails a conversion whose config a side reads otherwise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from legacy_env import here_has_flax_transformers, legacy_python  # noqa: E402
from test_convert import convert  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.convert.legacy_config import flax_target_config, rope_meaning  # noqa: E402

pytestmark = pytest.mark.slow
LLAMA = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def llama(root: Path, *, theta: float) -> Path:
    """A tiny Llama saved by this environment's transformers: 5.x (the development venv) writes
    `rope_parameters`; 4.57 (.venv-tf4) writes `rope_theta`, which `as_transformers_5` rewrites."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA, rope_theta=theta))
    with torch.no_grad():  # randomized norms, so a wrong mapping of them would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(root)
    return root


def as_transformers_5(directory: Path, **rope_parameters: object) -> dict:
    """Rewrite config.json exactly as transformers 5.25.0 writes it (the same tiny LlamaConfig saved by
    5.25.0 was compared key by key): `modeling_rope_utils.py` RotaryEmbeddingConfigMixin.standardize_rope_params
    moves rope_theta into `rope_parameters` with `rope_type` "default" (LlamaConfig in
    `models/llama/configuration_llama.py` has no rope_theta/rope_scaling fields any more), and
    `configuration_utils.py` PreTrainedConfig.to_dict writes the dtype under `dtype`."""
    path = directory / "config.json"
    old = json.loads(path.read_text())
    if "rope_parameters" in old:  # written by transformers 5 itself: only the RoPE a test asks for changes
        assert "rope_theta" not in old and "torch_dtype" not in old and old["dtype"], old
        if rope_parameters:
            old["rope_parameters"] = rope_parameters
            path.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
        return old
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    new["dtype"] = old.get("dtype", old.get("torch_dtype"))
    new["rope_parameters"] = rope_parameters or {"rope_theta": float(old["rope_theta"]), "rope_type": "default"}
    new.setdefault("pad_token_id", None)
    new["transformers_version"] = "5.25.0"
    path.write_text(json.dumps(new, indent=2, sort_keys=True) + "\n")
    return new


# run by transformers 4.57 (.venv-tf4, or this interpreter when it is 4.x): its Flax Llama's logits, or its
# reading of a config; JSON on stdout
IN_TRANSFORMERS_4 = """
import json, sys
import numpy as np
import transformers
if sys.argv[1] == "logits":
    model = transformers.FlaxLlamaForCausalLM.from_pretrained(sys.argv[2])
    print(json.dumps(np.asarray(model(np.array(json.loads(sys.argv[3]), dtype=np.int32)).logits).tolist()))
else:
    config = transformers.AutoConfig.from_pretrained(sys.argv[2])
    print(json.dumps({k: getattr(config, k, None) for k in sys.argv[3].split(",")}))
"""


def in_transformers_4(*args: str) -> object:
    done = subprocess.run([str(legacy_python()), "-c", IN_TRANSFORMERS_4, *args], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def read_by_transformers_4(directory: Path, *keys: str) -> dict:
    return in_transformers_4("read", str(directory), ",".join(keys))  # type: ignore[return-value]


def logits(directory: Path, ids: np.ndarray, *, flax: bool = False) -> np.ndarray:
    if flax:  # transformers 4's Flax class, wherever it is installed
        return np.asarray(in_transformers_4("logits", str(directory), json.dumps(ids.tolist())), dtype=np.float32)
    model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


IDS = np.arange(48, dtype=np.int32).reshape(1, 48) % 64  # far enough along for the theta to matter


def test_a_transformers_5_config_is_written_in_4x_keys(tmp_path: Path) -> None:
    src = llama(tmp_path / "src", theta=10_000.0)
    as_transformers_5(src)
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
    written = json.loads((tmp_path / "f" / "config.json").read_text())
    assert "rope_parameters" not in written
    assert written["rope_theta"] == 10_000.0 and written["rope_scaling"] is None
    assert written["torch_dtype"] == written["dtype"] == "float32"  # 4.40-4.55 read only torch_dtype
    assert read_by_transformers_4(tmp_path / "f", "rope_theta", "rope_scaling") == \
        {"rope_theta": 10_000.0, "rope_scaling": None}
    np.testing.assert_allclose(logits(tmp_path / "f", IDS, flax=True), logits(src, IDS), atol=1e-5)


def test_rope_theta_the_flax_class_cannot_compute_is_refused(tmp_path: Path) -> None:
    src = llama(tmp_path / "src", theta=500_000.0)
    as_transformers_5(src)
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "-f", "json", "-o", report) == 1
    data = json.loads(report.read_text())
    [finding] = data["findings"]
    assert finding["code"] == "CG304" and "rope_theta is 500000" in finding["message"]
    assert "fixed base 10000" in finding["message"]
    assert "--to maxtext" in data["extra"]["conversion"]["next_step"]
    assert not (tmp_path / "f").exists()


@pytest.mark.transformers4  # transformers 4.57's own from_pt, in process
def test_why_flax_llama_cannot_hold_theta_500000(tmp_path: Path) -> None:
    """transformers 4.57's FlaxLlamaForCausalLM, given rope_theta 500000 in the 4.x key it would read,
    computes the theta-10000 model: the refusal above is the truth about the target, not caution."""
    wide, plain = llama(tmp_path / "wide", theta=500_000.0), llama(tmp_path / "plain", theta=10_000.0)
    flax_dir = tmp_path / "flax"
    transformers.FlaxLlamaForCausalLM.from_pretrained(wide, from_pt=True).save_pretrained(flax_dir)
    assert transformers.AutoConfig.from_pretrained(flax_dir).rope_theta == 500_000.0
    got = logits(flax_dir, IDS, flax=True)
    np.testing.assert_allclose(got, logits(plain, IDS), atol=1e-5)
    assert np.abs(got - logits(wide, IDS)).max() > 1e-4  # 6e-4 here; the control above is within 1e-5


@pytest.mark.parametrize(("rope", "said"), [
    ({"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}, "RoPE is scaled (rope_type 'llama3')"),
    ({"rope_type": "proportional", "rope_theta": 10_000.0}, "rope_type 'proportional' is not one transformers 4.x"),
    ({"full_attention": {"rope_type": "default", "rope_theta": 1e6},
      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, "one RoPE per layer type"),
])
def test_what_4x_cannot_express_is_refused(tmp_path: Path, rope: dict, said: str) -> None:
    src = llama(tmp_path / "src", theta=10_000.0)
    as_transformers_5(src, **rope)
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "-f", "json", "-o", report) == 1
    [finding] = json.loads(report.read_text())["findings"]
    assert finding["code"] == "CG304" and said in finding["message"]
    assert not (tmp_path / "f").exists()


@pytest.mark.transformers4  # transformers 4.57's own from_pt on a v5 config, in process
def test_a_v5_config_converted_without_translation_fails_parity(tmp_path: Path) -> None:
    """transformers' own from_pt keeps the v5 config's meaning in an attribute 4.57 never reads: both of
    parity's 4.57 sides run theta 10000 and agree; the config check says CG302 on rope_theta."""
    src = llama(tmp_path / "src", theta=500_000.0)
    as_transformers_5(src)
    flax_dir = tmp_path / "flax"
    transformers.FlaxLlamaForCausalLM.from_pretrained(src, from_pt=True).save_pretrained(flax_dir)
    report = tmp_path / "r.json"
    assert main(["parity", str(src), str(flax_dir), "-f", "json", "-o", str(report)]) == 1
    findings = json.loads(report.read_text())["findings"]
    assert {f["code"] for f in findings} == {"CG302"}
    assert {m for f in findings for m in ("PyTorch", "Flax") if f"the {m} side reads 10000" in f["message"]} == \
        {"PyTorch", "Flax"}
    assert all("rope_theta = 500000" in f["message"] for f in findings)


def test_a_translated_conversion_passes_parity(tmp_path: Path) -> None:
    src = llama(tmp_path / "src", theta=10_000.0)
    as_transformers_5(src)
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--parity", "-f", "json", "-o", report) == 0
    data = json.loads(report.read_text())
    assert data["extra"]["parity"]["passed"] is True


def test_a_changed_size_or_dtype_is_cg302(tmp_path: Path) -> None:
    src = llama(tmp_path / "src", theta=10_000.0)
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
    shutil.copytree(tmp_path / "f", tmp_path / "g")
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"  # the weights stay fp32 on both sides
    (tmp_path / "g" / "config.json").write_text(json.dumps(config))
    report = tmp_path / "r.json"
    assert main(["parity", str(src), str(tmp_path / "g"), "-f", "json", "-o", str(report)]) == 1
    [finding] = json.loads(report.read_text())["findings"]
    assert finding["code"] == "CG302" and "dtype = 'BF16'" not in finding["message"]
    assert "means dtype = 'F32'" in finding["message"] and "Flax side reads 'BF16'" in finding["message"]


def test_rope_meaning_reads_both_layouts() -> None:
    assert rope_meaning({"rope_theta": 5e5, "rope_scaling": None}) == (5e5, None, None)
    assert rope_meaning({"rope_parameters": {"rope_type": "default"}}) == (10_000.0, None, None)
    theta, scaling, problem = rope_meaning({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}})
    assert (theta, scaling, problem) == (1e6, {"rope_type": "yarn", "factor": 4.0}, None)
    out, findings = flax_target_config({"model_type": "bert", "dtype": "bfloat16"}, where="c")
    assert out == {"model_type": "bert", "torch_dtype": "bfloat16", "dtype": "bfloat16"} and findings == []
    out, findings = flax_target_config({"model_type": "gptj", "rope_parameters": {"rope_theta": 1e4,
                                                                                  "rope_type": "default"}},
                                       where="c")
    assert out["rope_theta"] == 1e4 and out["rope_scaling"] is None and "rope_parameters" not in out
    qwen3 = {"model_type": "qwen3", "rope_parameters": {"full_attention": {}, "sliding_attention": {}}}
    assert flax_target_config(qwen3, where="c") == (qwen3, [])  # no Flax class: the mapping says so


def test_t5_v1_1_written_by_transformers_5_keeps_its_untied_head(tmp_path: Path) -> None:
    """5.25's T5Config forces tie_word_embeddings true and keeps a v1.1 model's "untied, unscaled" in
    scale_decoder_outputs (`models/t5/configuration_t5.py` __post_init__); 4.x reads it from
    tie_word_embeddings, so the Flax config says false again, and a 4.57 PyTorch side reading the v5
    config (tied: the decoder output scaled, lm_head ignored) is CG302 before any output is compared; under
    transformers 5 parity's PyTorch side is the version that wrote the config, and the two sides agree."""
    torch.manual_seed(0)
    src = tmp_path / "src"
    transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False)).save_pretrained(src)
    path = src / "config.json"
    config = json.loads(path.read_text())
    config.update(tie_word_embeddings=True, scale_decoder_outputs=False, transformers_version="5.25.0")
    path.write_text(json.dumps(config))
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
    written = json.loads((tmp_path / "f" / "config.json").read_text())
    assert written["tie_word_embeddings"] is False and "scale_decoder_outputs" not in written
    assert read_by_transformers_4(tmp_path / "f", "tie_word_embeddings") == {"tie_word_embeddings": False}
    report = tmp_path / "r.json"
    if not here_has_flax_transformers():  # parity's PyTorch side is transformers 5, which reads its own config
        assert main(["parity", str(src), str(tmp_path / "f"), "-f", "json", "-o", str(report)]) == 0
        assert "CG302" not in {f["code"] for f in json.loads(report.read_text())["findings"]}
        return
    assert main(["parity", str(src), str(tmp_path / "f"), "-f", "json", "-o", str(report)]) == 1
    [finding] = json.loads(report.read_text())["findings"]
    assert finding["code"] == "CG302" and "tie_word_embeddings = False" in finding["message"]
    assert "PyTorch side reads True" in finding["message"]


def test_gemma_activation_and_bidirectional_attention() -> None:
    out, findings = flax_target_config({"model_type": "gemma", "hidden_act": "gelu"}, where="c")
    assert out["hidden_activation"] == "gelu_pytorch_tanh" and findings == []  # what 5.x's GemmaConfig makes of it
    out, findings = flax_target_config({"model_type": "gemma", "hidden_act": "silu"}, where="c")
    assert out["hidden_activation"] == "silu"
    _, [finding] = flax_target_config({"model_type": "gemma", "use_bidirectional_attention": True}, where="c")
    assert finding.code == "CG304" and "bidirectional" in finding.message
