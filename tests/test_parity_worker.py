"""Parity's Flax side in a transformers-4 environment, its PyTorch side on transformers 5 (issue 29).

transformers 5 has no Flax models.  `parity` and `convert --parity` run the PyTorch side with the
installed transformers, which reads the config it wrote, and the Flax side through the worker protocol
in the environment --flax-python (or CKPT_GUARD_FLAX_PYTHON, or the managed tf4 environment) names.  The real
cross-version run: the CLI under a transformers-5 Python, the Flax side under `legacy_python()`.  A Llama whose v5
config means rope_theta 500000 against the Flax model that computes 10000 is CG302 on the Flax side
alone: the v5 PyTorch side reads it right (under 4.57 both sides read 10000).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
from legacy_env import ROOT, legacy_python  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from test_convert import convert  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.envs.protocol import ProtocolError, check_answer  # noqa: E402
from guard.parity import needs  # noqa: E402

LLAMA = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
# run by the transformers-5 Python: a tiny Llama with randomized norms, saved by 5.x's save_pretrained
SAVE_V5_LLAMA = """
import json, sys, torch, transformers
assert int(transformers.__version__.split(".")[0]) >= 5, transformers.__version__
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**json.loads(sys.argv[2])))
with torch.no_grad():
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(1 + 0.1 * torch.randn_like(p))
model.to(getattr(torch, sys.argv[3])).save_pretrained(sys.argv[1])
"""


def transformers5_python() -> Path:
    """This Python when its transformers is 5.x, else `.venv-latest`'s (`make latest-venv`, built by make test)."""
    if int(importlib.metadata.version("transformers").split(".")[0]) >= 5:
        return Path(sys.executable)
    latest = ROOT / ".venv-latest" / "bin" / "python"
    if not latest.exists():
        raise AssertionError("no transformers-5 environment: run `make latest-venv` (make test builds it)")
    return latest


def environment() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != needs.FLAX_PYTHON_ENV}, "PYTHONPATH": str(ROOT),
            "HF_HUB_OFFLINE": "1", "CI": "true"}


def run_t5(*args: object) -> subprocess.CompletedProcess[str]:
    """`ckpt-guard` from this working tree, under transformers 5."""
    return subprocess.run([str(transformers5_python()), "-m", "guard", *map(str, args)], capture_output=True,
                          text=True, env=environment(), timeout=600, cwd=ROOT)


def v5_llama(directory: Path, *, dtype: str = "float32") -> Path:
    done = subprocess.run([str(transformers5_python()), "-c", SAVE_V5_LLAMA, str(directory), json.dumps(LLAMA), dtype],
                          capture_output=True, text=True, env=environment(), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((directory / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_theta": 10_000.0, "rope_type": "default"} and "rope_theta" not in config
    return directory


def meaning_theta(directory: Path, theta: float) -> None:
    """The planted defect: the same weights, a v5 config meaning another rope_theta."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["rope_parameters"]["rope_theta"] = theta
    path.write_text(json.dumps(config, indent=2))


def parity_report(tmp_path: Path, torch_dir: Path, flax_dir: Path, *extra: object) -> tuple[int, dict]:
    report = tmp_path / f"report-{torch_dir.name}.json"
    done = run_t5("parity", torch_dir, flax_dir, "--flax-python", legacy_python(), "-f", "json", "-o", report, *extra)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(report.read_text())


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One fp32 v5 Llama and its Flax conversion, shared; each test takes copies."""
    root = tmp_path_factory.mktemp("v5")
    src = v5_llama(root / "src")
    assert convert(src, "--to", "flax", "--out", root / "flax") == 0
    return src, root / "flax"


def copies(pair: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    return tuple(Path(shutil.copytree(p, tmp_path / p.name)) for p in pair)  # type: ignore[return-value]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_v5_llama_converted_passes_with_the_flax_side_in_transformers_4(tmp_path: Path, dtype: str,
                                                                         converted: tuple[Path, Path]) -> None:
    if dtype == "float32":
        src, _ = converted
    else:
        src = v5_llama(tmp_path / "src", dtype=dtype)
        assert convert(src, "--to", "flax", "--out", tmp_path / "flax") == 0
    code, data = parity_report(tmp_path, src, converted[1] if dtype == "float32" else tmp_path / "flax", "--drift")
    parity = data["extra"]["parity"]
    assert code == 0 and parity["passed"] is True and data["findings"] == []
    assert parity["flax_side"]["transformers"].startswith("4.") and parity["flax_class"] == "FlaxLlamaForCausalLM"
    assert parity["flax_side"]["python"] == str(legacy_python())
    fp32 = next(c for c in parity["comparisons"] if c["name"] == "fp32")
    assert fp32["passed"] is True and fp32["outputs"]["logits"]["max_rel"] < 1e-5
    assert parity["default_precision_drift"]["output"] == "logits"  # asked for: a figure, computed in the worker
    assert len(parity["comparisons"]) == (1 if dtype == "float32" else 4)


@pytest.mark.slow
def test_the_rope_theta_the_flax_class_cannot_compute_is_cg302_on_the_flax_side(tmp_path: Path,
                                                                               converted: tuple[Path, Path]) -> None:
    src, flax_dir = copies(converted, tmp_path)
    meaning_theta(src, 500_000.0)  # transformers 5 reads it; 4.x's FlaxLlama computes base 10000 whatever it says
    code, data = parity_report(tmp_path, src, flax_dir)
    assert code == 1
    [finding] = data["findings"]
    assert finding["code"] == "CG302" and "means rope_theta = 500000" in finding["message"]
    assert "the Flax side reads 10000" in finding["message"]  # the PyTorch side, on 5.x, reads 500000: no finding
    assert data["extra"]["parity"]["passed"] is False and data["extra"]["parity"]["comparisons"] == []


@pytest.mark.slow
def test_changed_weights_fail_through_the_worker(tmp_path: Path, converted: tuple[Path, Path]) -> None:
    """The outputs themselves are compared: a source norm scaled by 1.01 after the conversion is CG302."""
    src, flax_dir = copies(converted, tmp_path)
    tensors = load_file(src / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.01
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, data = parity_report(tmp_path, src, flax_dir)
    assert code == 1 and {f["code"] for f in data["findings"]} == {"CG302"}
    fp32 = next(c for c in data["extra"]["parity"]["comparisons"] if c["name"] == "fp32")
    assert fp32["passed"] is False and fp32["outputs"]["logits"]["max_rel"] > 1e-3


@pytest.mark.slow
def test_both_sides_stream_and_a_miss_is_located_to_its_block_through_the_worker(
        tmp_path: Path, converted: tuple[Path, Path]) -> None:
    """Each side streams block by block (the PyTorch side here on transformers 5, the Flax side in the worker on
    transformers 4, by the blocks of its own PyTorch twin), and the worker sends each block's output back: a
    weight changed in the last layer's MLP after the conversion is CG302 naming that module, the first block
    agreeing."""
    src, flax_dir = copies(converted, tmp_path)
    code, data = parity_report(tmp_path, src, flax_dir)
    parity = data["extra"]["parity"]
    assert code == 0 and parity["streamed"] is True and parity["blocks"] == 2, parity.get("not_streamed")
    assert parity["leaves_streamed"] == ["flax", "torch"]
    fp32 = next(c for c in parity["comparisons"] if c["name"] == "fp32")
    assert fp32["located"]["blocks_compared"] == 2 and fp32["located"]["failing_blocks"] == 0
    tensors = load_file(src / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name] * 1.05
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, data = parity_report(tmp_path, src, flax_dir)
    fp32 = next(c for c in data["extra"]["parity"]["comparisons"] if c["name"] == "fp32")
    assert code == 1 and fp32["located"]["first"]["module"] == "model.layers.1.mlp", fp32["located"]
    per_block = {b["block"]: b for b in fp32["located"]["per_block"]}
    assert per_block["model.layers.0"]["max_rel"] <= per_block["model.layers.0"]["bound"]
    [finding] = data["findings"]
    assert finding["code"] == "CG302" and "model.layers.1" in finding["message"]


@pytest.mark.slow
def test_convert_parity_runs_the_flax_side_where_it_is_named(tmp_path: Path, converted: tuple[Path, Path]) -> None:
    """In this process, whatever its transformers: --flax-python sends the Flax side to the worker."""
    src = converted[0]
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "flax", "--parity", "--flax-python", legacy_python(),
                   "-f", "json", "-o", report) == 0
    parity = json.loads(report.read_text())["extra"]["parity"]
    assert parity["passed"] is True and parity["flax_side"]["transformers"].startswith("4.")
    assert parity["streamed"] is True and parity["blocks"] == 2, parity.get("not_streamed")


@pytest.mark.slow
def test_a_transformers_5_flax_python_is_one_line_and_nothing_written(tmp_path: Path, converted: tuple[Path, Path],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    src = converted[0]
    t5 = transformers5_python()
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--parity", "--flax-python", t5) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ckpt-guard: error: --parity: --flax-python {t5} has transformers 5.")
    assert "which tf4 cannot run on (transformers 5 removed its Flax models" in line
    assert line.endswith("; nothing written")
    assert not (tmp_path / "f").exists()


def test_the_environment_variable_names_the_flax_side(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(needs.FLAX_PYTHON_ENV, str(legacy_python()))
    assert needs.flax_side_python(None) == Path(os.path.abspath(legacy_python()))
    monkeypatch.setenv(needs.FLAX_PYTHON_ENV, str(tmp_path / "missing" / "python"))
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # a folder without one is refused first
    assert main(["parity", str(tmp_path), str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == f"ckpt-guard: error: parity: {needs.FLAX_PYTHON_ENV}={tmp_path / 'missing' / 'python'}: no such file"


def test_found_in_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Named > environment variable > this process when it is 4.x > the managed tf4 environment > one line."""
    monkeypatch.delenv(needs.FLAX_PYTHON_ENV, raising=False)
    monkeypatch.setattr(importlib.metadata, "version", lambda name, real=importlib.metadata.version: (
        "5.25.0" if name == "transformers" else real(name)))
    home = os.environ["CKPT_GUARD_HOME"]
    monkeypatch.setenv("CKPT_GUARD_HOME", str(tmp_path / "none"))
    with pytest.raises(needs.UsageError, match=r"run `ckpt-guard env install tf4`, or name its Python with "
                                               r"--flax-python"):
        needs.flax_side_python(None)
    monkeypatch.setenv("CKPT_GUARD_HOME", home)
    assert needs.flax_side_python(None) == Path(os.path.abspath(legacy_python()))
    monkeypatch.undo()
    if importlib.metadata.version("transformers").startswith("4."):  # the Flax side can run right here
        assert needs.flax_side_python(None) is None
    assert needs.flax_side_python(legacy_python()) == Path(os.path.abspath(legacy_python()))


def test_a_flax_answer_is_protocol_1() -> None:
    assert check_answer({"protocol": 1, "loads": [], "parity": {"unavailable": "x"}})["parity"] == {"unavailable": "x"}
    with pytest.raises(ProtocolError):
        check_answer({"protocol": 1, "loads": [], "parity": ["not", "an", "object"]})


@pytest.mark.slow
def test_no_flax_twin_is_cg303_from_the_worker(tmp_path: Path) -> None:
    """qwen2 has no Flax class in transformers 4: the worker says so, and the report says unavailable."""
    for side in ("pt", "flax"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "config.json").write_text(json.dumps({"model_type": "qwen2",
                                                                 "architectures": ["Qwen2ForCausalLM"]}))
    report = tmp_path / "r.json"
    assert main(["parity", str(tmp_path / "pt"), str(tmp_path / "flax"), "--flax-python", str(legacy_python()),
                 "-f", "json", "-o", str(report)]) == 0
    data = json.loads(report.read_text())
    [finding] = data["findings"]
    assert finding["code"] == "CG303" and "no paired PyTorch/Flax classes for model_type 'qwen2'" in finding["message"]
    assert data["extra"]["parity"]["available"] is False
    assert data["extra"]["parity"]["flax_side"]["transformers"].startswith("4.")
