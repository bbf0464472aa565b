"""Discovery: one listing per folder, and nothing that cannot be weights is stat'ed or opened.

The safetensors files are written by the safetensors library; the trees around them are what a
repository holds (sources, docs, images).  Speed is bench/scan.py's (``--cases discovery``); these
tests pin the behaviour the fast walk must keep.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from guard.inventory import discover_models

np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _weights(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors_numpy.save_file({"w": np.zeros((128, 128), np.float32)}, str(path))  # 64 KiB: sniffable
    return path


def _found(root: Path) -> dict[str, list[str]]:
    return {Path(m.directory).relative_to(root).as_posix(): sorted(Path(p).name for p in m.weight_files)
            for m in discover_models([root])}


def test_a_tree_of_sources_holds_one_model_and_nothing_else(tmp_path: Path) -> None:
    for i, suffix in enumerate(("py", "md", "json", "txt", "png", "c", "h", "js", "yaml", "csv") * 20):
        folder = tmp_path / "src" / f"pkg{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i}.{suffix}").write_bytes(b"x" * 100)
    _weights(tmp_path / "models" / "tiny" / "model.safetensors")
    assert _found(tmp_path) == {"models/tiny": ["model.safetensors"]}


def test_a_file_whose_suffix_says_nothing_is_still_sniffed(tmp_path: Path) -> None:
    weights = _weights(tmp_path / "m" / "model.safetensors")
    os.rename(weights, tmp_path / "m" / "renamed.weights")  # a weight file renamed: found by its magic bytes
    os.link(tmp_path / "m" / "renamed.weights", tmp_path / "m" / "LICENSE")  # no suffix at all: sniffed too
    assert _found(tmp_path) == {"m": ["LICENSE", "renamed.weights"]}


def test_a_file_whose_suffix_says_source_or_text_is_never_read(tmp_path: Path) -> None:
    """Weights hidden under a source or text suffix are not sniffed (they are never stat'ed or opened)."""
    weights = _weights(tmp_path / "m" / "model.safetensors")
    for name in ("kernel.c", "bundle.js", "notes.txt", "logo.png"):
        os.link(weights, tmp_path / "m" / name)
    assert _found(tmp_path) == {"m": ["model.safetensors"]}


def test_a_file_named_on_the_command_line_is_read_whatever_its_suffix(tmp_path: Path) -> None:
    weights = _weights(tmp_path / "m" / "model.safetensors")
    os.link(weights, tmp_path / "m" / "kernel.c")
    (model,) = discover_models([tmp_path / "m" / "kernel.c"])
    assert sorted(Path(p).name for p in model.weight_files) == ["kernel.c", "model.safetensors"]


def test_folders_the_walk_skips_and_symlinked_folders(tmp_path: Path) -> None:
    _weights(tmp_path / "a" / "model.safetensors")
    _weights(tmp_path / ".git" / "lfs" / "model.safetensors")
    _weights(tmp_path / "node_modules" / "x" / "model.safetensors")
    _weights(tmp_path / "b" / ".ckpt-guard-fix-123" / "model.safetensors")  # a fix's staging folder
    (tmp_path / "c").symlink_to(tmp_path / "a", target_is_directory=True)  # not entered: `a` is scanned once
    assert _found(tmp_path) == {"a": ["model.safetensors"]}


def test_models_come_in_the_order_os_walk_visits_their_folders(tmp_path: Path) -> None:
    for folder in ("b/y", "a", "b", "a/z", "c/x/deep", "b/x"):
        _weights(tmp_path / folder / "model.safetensors")
    walked = [Path(d).relative_to(tmp_path).as_posix() or "."
              for d, dirs, _ in os.walk(tmp_path) if not dirs.sort()]  # os.walk, folders sorted as discovery does
    found = list(_found(tmp_path))
    assert found == [d for d in walked if d in found]


def test_a_folder_holding_only_an_index_or_an_ir_graph_is_still_a_model(tmp_path: Path) -> None:
    """Names alone that make a model without a weight file: an index (CG004 for its missing shards) and an
    OpenVINO graph whose .bin is missing (CG004); neither suffix is one a reader reads."""
    (tmp_path / "sharded").mkdir()
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text('{"weight_map": {"w": "x.safetensors"}}')
    (tmp_path / "ir").mkdir()
    (tmp_path / "ir" / "openvino_model.xml").write_text("<net/>")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.json").write_text("{}")
    models = {Path(m.directory).name: m for m in discover_models([tmp_path])}
    assert sorted(models) == ["ir", "sharded"]
    assert [Path(p).name for p in models["sharded"].json_files] == ["model.safetensors.index.json"]
    assert [Path(p).name for p in models["ir"].weight_files] == ["openvino_model.xml"]
