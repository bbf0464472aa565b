"""A directory the user named that holds no checkpoint is CG010 (a warning), so ``--fail-on warning`` catches a
gate pointed at the wrong folder; no view says "passed" about a scan that found nothing. Files named one by
one (the pre-commit hook's) and the default "." never get it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from guard.cli import main  # noqa: E402


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository whose weights are in outputs/, with models/ holding a config and a README only."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text('{"model_type": "bert"}\n')
    (tmp_path / "models" / "README.md").write_text("weights are written by the training job\n")
    (tmp_path / "outputs").mkdir()
    safetensors_torch.save_file({"w": torch.zeros(2, 2)}, tmp_path / "outputs" / "model.safetensors",
                                metadata={"format": "pt"})
    return tmp_path


def test_a_named_directory_without_checkpoints_is_a_warning_that_fails_the_gate(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "models"]) == 0
    out = capsys.readouterr().out
    assert "models: CG010 [warning] no checkpoint files found" in out
    assert "passed" not in out and out.rstrip().endswith(
        "ckpt-guard: no checkpoint files found; 0 error(s), 1 warning(s), 0 note(s) (fail-on: error)")
    assert main(["scan", "--fail-on", "warning", "models"]) == 1
    assert "ckpt-guard: FAILED: no checkpoint files found" in capsys.readouterr().out


def test_each_named_directory_is_judged_alone(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "--format", "json", "--fail-on", "warning", "outputs", "models"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(f["code"], f["severity"], f["path"]) for f in report["findings"]] == [("CG010", "warning", "models")]
    assert main(["scan", "--format", "json", "--fail-on", "warning", "outputs", "."]) == 0  # . holds outputs/
    assert json.loads(capsys.readouterr().out)["findings"] == []


@pytest.mark.parametrize("args", [["config.json"], []])
def test_named_files_and_the_default_dot_never_get_it(tree: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    """The hook passes staged files (a config.json alone among them); a plain `scan` in an empty folder is
    asked of no folder in particular."""
    monkeypatch.chdir(tree / "models")
    assert main(["scan", "--fail-on", "warning", *args]) == 0
    out = capsys.readouterr().out
    assert "CG010" not in out and "passed" not in out and "no checkpoint files found; 0 error(s)" in out


def test_it_can_be_ignored_and_every_view_says_nothing_was_found(tree: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", "--fail-on", "warning", "--ignore", "CG010", "models"]) == 0
    assert "CG010" not in capsys.readouterr().out
    assert main(["scan", "--format", "markdown", "models"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("## :warning: ckpt-guard found no checkpoint files\n") and "passed" not in markdown
    assert main(["scan", "--format", "github", "--fail-on", "warning", "models"]) == 1
    github = capsys.readouterr().out
    assert "::warning file=models,title=CG010 no-checkpoint-found::" in github
    assert github.rstrip().splitlines()[-1].startswith("ckpt-guard: FAILED: no checkpoint files found")
