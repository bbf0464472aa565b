"""What the weight-set tests share: a JSON scan through the real CLI, and views of its report."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from guard.cli import main


def json_scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    capsys.readouterr()  # what building the layout printed is not the report
    code = main(["scan", "--format", "json", "--no-summary", *args])
    return code, json.loads(capsys.readouterr().out)


def codes(report: dict, *, severity: str | None = None) -> set[str]:
    return {f["code"] for f in report["findings"] if severity is None or f["severity"] == severity}


def errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def model(report: dict, suffix: str) -> dict:
    found = [m for m in report["models"] if m["path"].endswith(suffix)]
    assert len(found) == 1, [m["path"] for m in report["models"]]
    return found[0]


def sets_of(report: dict, suffix: str) -> dict[str, dict]:
    return {s["name"]: s for s in model(report, suffix)["sets"]}


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def tree_state(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file and directory under root (hidden ones too), with its bytes and mode: a dry run, a refused
    or a killed fix must leave it equal, staging directories included."""
    out: dict[str, tuple[bytes | None, int]] = {}
    for current, dirs, files in os.walk(root):
        for name in dirs:
            path = os.path.join(current, name)
            out[os.path.relpath(path, root)] = (None, os.stat(path).st_mode)
        for name in files:
            path = os.path.join(current, name)
            out[os.path.relpath(path, root)] = (Path(path).read_bytes(), os.stat(path).st_mode)
    return out
