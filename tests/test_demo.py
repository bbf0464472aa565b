"""`make demo` can run again: it rebuilds a folder it made, and never touches one it did not."""

from __future__ import annotations

from pathlib import Path

from guard.demo import MARKER, fresh_root


def test_a_folder_the_demo_made_is_rebuilt_from_nothing(tmp_path: Path) -> None:
    root = tmp_path / "demo-models"
    assert fresh_root(root) is None
    (root / "layouts").mkdir()
    (root / "layouts" / "stale.msgpack").write_bytes(b"\x82")  # what broke from_pt on a second run
    assert fresh_root(root) is None
    assert sorted(p.name for p in root.iterdir()) == [MARKER]


def test_a_folder_from_before_the_marker_counts_by_its_names(tmp_path: Path) -> None:
    root = tmp_path / "demo-models"
    (root / "layouts").mkdir(parents=True)
    (root / "report.json").write_text("{}")
    assert fresh_root(root) is None
    assert sorted(p.name for p in root.iterdir()) == [MARKER]


def test_any_other_folder_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "precious.safetensors").write_bytes(b"x")
    assert fresh_root(tmp_path) == f"{tmp_path} exists and was not made by this demo; choose another folder"
    assert (tmp_path / "precious.safetensors").read_bytes() == b"x"
    file = tmp_path / "precious.safetensors"
    assert fresh_root(file) is not None and file.read_bytes() == b"x"
