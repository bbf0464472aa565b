"""`ckpt-guard hub upload`: what the stand-in Hub received for failing and clean models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from hub_standin import StandinHub, standin_fixture  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.hub.upload import local_files  # noqa: E402


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def make_model(directory: Path, *, mixed: bool) -> Path:
    directory.mkdir(parents=True)
    tensors = {"w": np.ones((4, 4), np.float32), "b": np.ones((4,), np.float16 if mixed else np.float32)}
    safetensors_numpy.save_file(tensors, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    (directory / "README.md").write_text("---\nlicense: mit\n---\n# model\n")
    (directory / ".git").mkdir()
    (directory / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return directory


def test_failing_model_uploads_nothing(standin: StandinHub, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model(tmp_path / "bad", mixed=True)
    assert main(["hub", "upload", str(model), "org/new", "--token", "hf_bot"]) == 1
    captured = capsys.readouterr()
    assert "CG102" in captured.out and "nothing uploaded" in captured.err
    assert standin.records == []  # not even create_repo
    assert "org/new" not in standin.repos


def test_clean_model_is_uploaded(standin: StandinHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model(tmp_path / "good", mixed=False)
    assert main(["hub", "upload", str(model), "org/new", "--token", "hf_bot", "--private"]) == 0
    files = standin.files_at("org/new")
    assert set(files) == {"model.safetensors", "config.json", "README.md"}  # .git/ left out
    assert files["model.safetensors"] == (model / "model.safetensors").read_bytes()
    assert standin.repos["org/new"].private
    assert len(standin.matching(method="POST", contains="/commit/")) == 1  # one commit
    assert "hf_bot" not in capsys.readouterr().err
    # A second upload to the existing repository works too (create_repo exist_ok).
    assert main(["hub", "upload", str(model), "org/new", "--token", "hf_bot", "--commit-message", "again"]) == 0
    assert standin.commits[standin.repos["org/new"].refs["main"]].summary == "again"


def test_upload_to_a_new_branch(standin: StandinHub, tmp_path: Path) -> None:
    model = make_model(tmp_path / "good", mixed=False)
    assert main(["hub", "upload", str(model), "org/new", "--token", "hf_bot", "--revision", "dev"]) == 0
    assert "model.safetensors" in standin.files_at("org/new", "dev")
    assert "model.safetensors" not in standin.files_at("org/new", "main")


def test_create_pr_carries_the_report(standin: StandinHub, tmp_path: Path) -> None:
    standin.add_repo("org/existing", {"README.md": b"# hi\n"})
    model = make_model(tmp_path / "bad", mixed=True)
    rc = main(["hub", "upload", str(model), "org/existing", "--token", "hf_bot", "--create-pr"])
    assert rc == 1  # the policy still failed
    [pr] = standin.repos["org/existing"].discussions
    assert pr.is_pr and pr.ref == "refs/pr/1"
    assert "CG102" in pr.description and "failed" in pr.description
    assert "model.safetensors" in standin.files_at("org/existing", "refs/pr/1")
    assert set(standin.files_at("org/existing")) == {"README.md"}  # main untouched


def test_create_pr_for_a_clean_model_exits_0(standin: StandinHub, tmp_path: Path) -> None:
    model = make_model(tmp_path / "good", mixed=False)
    assert main(["hub", "upload", str(model), "org/new", "--token", "hf_bot", "--create-pr"]) == 0
    [pr] = standin.repos["org/new"].discussions
    assert "passed" in pr.description


def test_values_gate_dead_weights(standin: StandinHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--values reads the tensors: a zeroed matrix (CG207, a warning) stops the upload under --fail-on warning;
    without --values the headers alone pass it."""
    model = make_model(tmp_path / "dead", mixed=False)
    rng = np.random.default_rng(0)
    safetensors_numpy.save_file({"model.layers.0.mlp.up_proj.weight": np.zeros((8, 4), np.float32),
                                 "model.layers.0.mlp.down_proj.weight": rng.standard_normal((4, 8), np.float32)},
                                model / "model.safetensors")
    rc = main(["hub", "upload", str(model), "org/new", "--token", "hf_bot", "--values", "--fail-on", "warning"])
    captured = capsys.readouterr()
    assert rc == 1 and "CG207" in captured.out and "nothing uploaded" in captured.err
    assert "org/new" not in standin.repos
    assert main(["hub", "upload", str(model), "org/new", "--token", "hf_bot", "--fail-on", "warning"]) == 0
    assert "model.safetensors" in standin.files_at("org/new")


def test_upload_without_a_token_is_exit_2(standin: StandinHub, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model(tmp_path / "good", mixed=False)
    assert main(["hub", "upload", str(model), "org/new"]) == 2
    err = capsys.readouterr().err
    assert "token" in err and "Traceback" not in err
    assert "org/new" not in standin.repos


def test_upload_of_a_missing_directory_is_a_usage_error(standin: StandinHub, tmp_path: Path) -> None:
    assert main(["hub", "upload", str(tmp_path / "nope"), "org/new"]) == 2


def test_local_files_skip_git_and_the_hub_cache(tmp_path: Path) -> None:
    for rel in ("a.txt", "sub/b.bin", ".git/config", ".cache/huggingface/x", ".cache/other"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    assert [rel for rel, _ in local_files(tmp_path)] == [".cache/other", "a.txt", "sub/b.bin"]
