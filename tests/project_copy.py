"""Copy parts of this project's working tree into a temporary repository (act, pre-commit try-repo)."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_project(dest: Path, names: tuple[str, ...]) -> Path:
    """Copy the named files and folders (uncommitted changes included), skipping bytecode."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.is_file():
            shutil.copy2(src, dest / name)
    if not (dest / "README.md").exists():  # pyproject names it as the readme
        (dest / "README.md").write_text("ckpt-guard\n")
    return dest
