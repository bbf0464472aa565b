"""What the transformers-4 Flax side needs is known before anything is written (issue 29).

transformers 5 removed its Flax models: `convert --parity` and `parity` say so in one line, exit 2,
and leave no output, whether transformers is 5.x, missing, or cannot be imported.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from test_convert import convert  # noqa: E402
from test_convert_families import save_tiny  # noqa: E402
from test_convert_history import run_cli  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.parity import needs  # noqa: E402

REAL_VERSION = importlib.metadata.version


@pytest.fixture(autouse=True)
def no_flax_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No transformers-4 environment to be found: not named, and no managed one (an empty CKPT_GUARD_HOME)."""
    monkeypatch.delenv(needs.FLAX_PYTHON_ENV, raising=False)
    monkeypatch.setenv("CKPT_GUARD_HOME", str(tmp_path / "no-envs"))


def pretend_transformers(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """The installed transformers' metadata says ``version`` (as after `pip install 'transformers>=5'`)."""
    def version_of(name: str) -> str:
        return version if name == "transformers" else REAL_VERSION(name)

    monkeypatch.setattr(importlib.metadata, "version", version_of)


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ckpt-guard: error:")]


def test_convert_parity_with_transformers_5_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = save_tiny(tmp_path, "llama", "LlamaForCausalLM")
    pretend_transformers(monkeypatch, "5.25.0")
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--parity") == 2
    captured = capsys.readouterr()
    [line] = error_lines(captured.err)
    assert line.startswith("ckpt-guard: error: --parity: tf4 is not installed (transformers 5.25.0 here: "
                           "transformers 5 removed its Flax models")
    assert "run `ckpt-guard env install tf4`, or name its Python with --flax-python" in line
    assert line.endswith("; nothing written")
    assert "converted" not in captured.out
    assert not (tmp_path / "f").exists()
    assert not [p for p in tmp_path.iterdir() if p.name != "src"]  # no temp directory left either


def test_convert_without_parity_needs_no_transformers_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = save_tiny(tmp_path, "llama", "LlamaForCausalLM")
    pretend_transformers(monkeypatch, "5.25.0")
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
    assert (tmp_path / "f" / "flax_model.msgpack").is_file()


def test_parity_command_with_transformers_5_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    src = save_tiny(tmp_path, "llama", "LlamaForCausalLM")
    pretend_transformers(monkeypatch, "5.0.0")
    report = tmp_path / "r.json"
    assert main(["parity", str(src), str(src), "-f", "json", "-o", str(report)]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert "parity: tf4 is not installed (transformers 5.0.0 here" in line and "ckpt-guard env install tf4" in line
    assert not report.exists()


@pytest.mark.parametrize("args", [["{src}", "{src}"], ["{src}", "--against", "tunix"], ["{ok}", "{src}"]])
def test_parity_of_a_folder_without_config_json_is_one_line_naming_it(tmp_path: Path, args: list[str],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The weights alone (config.json not copied): said before any environment is looked for, where a bare
    "[Errno 2] No such file or directory: 'src/config.json'" came."""
    ok = save_tiny(tmp_path, "llama", "LlamaForCausalLM")
    src = tmp_path / "weights-only"
    src.mkdir()
    (src / "model.safetensors").write_bytes((ok / "model.safetensors").read_bytes())
    assert main(["parity", *(a.format(src=src, ok=ok) for a in args)]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert line == (f"ckpt-guard: error: {src}: no config.json: parity builds the model from it, as transformers "
                    "does; save the model with save_pretrained, or put the config.json it was trained with beside "
                    "the weights")


def test_same_framework_parity_is_refused_before_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = save_tiny(tmp_path, "llama", "LlamaForCausalLM")
    assert convert(src, "--to", "torch", "--out", tmp_path / "t", "--parity") == 2
    [line] = error_lines(capsys.readouterr().err)
    assert "same framework" in line and line.endswith("nothing written")
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
def test_convert_parity_with_transformers_hidden_writes_nothing(tmp_path: Path) -> None:
    """A fresh process where transformers cannot be found at all (find_spec says None)."""
    src = save_tiny(tmp_path, "llama", "LlamaForCausalLM", dtype=torch.bfloat16)
    done = run_cli("convert", str(src), "--to", "flax", "--out", str(tmp_path / "f"), "--parity",
                   block_transformers=True)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = error_lines(done.stderr)
    assert "none is installed" in line and "'transformers>=4.40,<5'" in line and line.endswith("nothing written")
    assert "converted" not in done.stdout and not (tmp_path / "f").exists()


@pytest.mark.parametrize(("version", "flax"), [("4.57.6", True), ("4.40.0", True), ("5.0.0", False),
                                               ("5.25.0", False), ("6.0.0.dev0", False), ("unknown", False)])
def test_has_flax_models(version: str, flax: bool) -> None:
    assert needs.has_flax_models(version) is flax

