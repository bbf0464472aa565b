"""The Hub applies the loading rules as the scan does: a missing-experts upload is refused by the gate, and the
reviewer's answer to a push names the experts; a vision-language model whose vision tower a text-only conversion
stripped is refused by the gate, named by the reviewer and by the remote scan, from the same table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")
transformers = pytest.importorskip("transformers")

from hub_delivery import AppServer as Service, make_reviewer  # noqa: E402
from hub_standin import StandinHub, standin_fixture  # noqa: E402
from test_hub_webhook import payload  # noqa: E402
from test_loading import save, tensors, write  # noqa: E402
from test_loading_families import save as save_family  # noqa: E402

from guard.cli import main  # noqa: E402


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def missing_experts(root: Path) -> Path:
    """A Qwen3-MoE (4 experts) saved by transformers, experts 2-3 left out (an EP save that never gathered them)."""
    save(root, "qwen3_moe")
    write(root, {k: v for k, v in tensors(root).items() if not any(f".experts.{e}." in k for e in (2, 3))})
    return root


def test_the_gate_refuses_missing_experts(standin: StandinHub, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    model = missing_experts(tmp_path / "moe")
    capsys.readouterr()
    assert main(["hub", "upload", str(model), "org/moe", "--token", "hf_bot"]) == 1
    captured = capsys.readouterr()
    assert "CG123" in captured.out and "experts 2–3 of 4" in captured.out and "nothing uploaded" in captured.err
    assert "org/moe" not in standin.repos


def test_the_whole_model_is_uploaded(standin: StandinHub, tmp_path: Path) -> None:
    model = save(tmp_path / "moe", "qwen3_moe")
    assert main(["hub", "upload", str(model), "org/moe", "--token", "hf_bot"]) == 0
    assert "model.safetensors" in standin.files_at("org/moe")


def test_the_reviewer_names_the_experts(standin: StandinHub, tmp_path: Path) -> None:
    model = missing_experts(tmp_path / "moe")
    files = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
    sha = standin.add_repo("org/moe", files)
    service = Service(make_reviewer(tmp_path / "queue.sqlite3"))
    try:
        assert service.post(payload("org/moe", "refs/heads/main", sha)).status_code == 202
        assert service.reviewer.wait_idle(60)
    finally:
        service.stop()
    [discussion] = standin.repos["org/moe"].discussions
    assert "CG123" in discussion.description and "experts 2–3 of 4" in discussion.description


def stripped_tower(root: Path) -> Path:
    """A Qwen2.5-VL saved by transformers, every visual.* tensor dropped and vision_config kept (mlx-vlm#1963)."""
    save_family(root, "qwen2_5_vl")
    write(root, {k: v for k, v in tensors(root).items() if not k.startswith("visual.")})
    return root


TOWER = "the vision tower would be random"


def test_the_gate_refuses_a_stripped_vision_tower(standin: StandinHub, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = stripped_tower(tmp_path / "vl")
    capsys.readouterr()
    assert main(["hub", "upload", str(model), "org/vl", "--token", "hf_bot"]) == 1
    captured = capsys.readouterr()
    assert "CG123" in captured.out and TOWER in captured.out and "nothing uploaded" in captured.err
    assert "org/vl" not in standin.repos


def test_the_reviewer_and_the_remote_scan_name_the_vision_tower(standin: StandinHub, tmp_path: Path) -> None:
    from test_hub_scan import run_json

    model = stripped_tower(tmp_path / "vl")
    files = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
    sha = standin.add_repo("org/vl", files)
    rc, report = run_json(["hub", "scan", "org/vl"], tmp_path / "r.json")
    assert rc == 1 and [f["code"] for f in report["findings"] if f["code"].startswith("CG12")] == ["CG123"]
    assert any(TOWER in f["message"] for f in report["findings"]), report["findings"]
    service = Service(make_reviewer(tmp_path / "queue.sqlite3"))
    try:
        assert service.post(payload("org/vl", "refs/heads/main", sha)).status_code == 202
        assert service.reviewer.wait_idle(60)
    finally:
        service.stop()
    [discussion] = standin.repos["org/vl"].discussions
    assert "CG123" in discussion.description and TOWER in discussion.description
