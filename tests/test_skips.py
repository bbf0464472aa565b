"""Tests that cannot vanish: a skip off tests/allowed_skips.py fails the run (a missing dependency or environment
is a broken set-up under `make test`), the list stays short, and the run ends with the skips and their reasons."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from allowed_skips import ALLOWED_SKIPS, allowed_skip

TESTS = Path(__file__).resolve().parent

# words that name a set-up, not a fact about the machine: none may be an allowed reason
SET_UP_WORDS = ("install", "missing", "not built", "could not import", "venv", "make ", "wheel", "fetch", " version")


def test_the_allowed_reasons_are_few_and_none_names_a_set_up() -> None:
    assert len(ALLOWED_SKIPS) <= 6
    for prefix, why in ALLOWED_SKIPS:
        assert prefix and why and not any(word in prefix.lower() for word in SET_UP_WORDS), prefix
    assert allowed_skip("cannot mount a tmpfs here; the ENOSPC cases below cover it by monkeypatch")
    assert not allowed_skip("could not import 'deepspeed': No module named 'deepspeed'")
    assert not allowed_skip("MaxText's venv is not built (make maxtext-venv: Python 3.12, maxtext[tpu]==0.2.5)")


SUITE = '''
import pytest

def test_runs():
    pass

def test_machine():
    pytest.skip("cannot mount a tmpfs here; covered by monkeypatch")

def test_environment():
    pytest.skip("MaxText's venv is not built")

@pytest.mark.skipif(True, reason="needs a library make test installs")
def test_marked():
    pass
'''


def _pytest(tmp_path: Path, files: dict[str, str], **env: str) -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    switches = ("CI", "CKPT_GUARD_PARTIAL_ENV", "CKPT_GUARD_STRICT_SKIPS")
    clean = {k: v for k, v in os.environ.items() if k not in switches}
    # this suite's conftest as a plugin, over a folder of its own (its rootdir, without the project's addopts)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                           "--rootdir", str(tmp_path), "-c", os.devnull, *files],
                          cwd=tmp_path, env={**clean, "PYTHONPATH": str(TESTS), **env}, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("env", [{}, {"CKPT_GUARD_PARTIAL_ENV": "1", "CI": "true"},
                                 {"CKPT_GUARD_PARTIAL_ENV": "1", "CKPT_GUARD_STRICT_SKIPS": "1"}])
def test_a_skip_for_a_missing_environment_fails_and_the_run_names_the_skips(tmp_path: Path,
                                                                           env: dict[str, str]) -> None:
    done = _pytest(tmp_path, {"test_suite.py": SUITE}, **env)
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed, 1 skipped, 1 error" in done.stdout  # a skipif mark fails in setup: an error
    assert "skipped, and skips are strict here: MaxText's venv is not built" in done.stdout
    assert "skipped, and skips are strict here: needs a library make test installs" in done.stdout
    assert "1 skipped:\n  1 x cannot mount a tmpfs here; covered by monkeypatch\n" in done.stdout


def test_a_partial_environment_by_choice_may_skip(tmp_path: Path) -> None:
    done = _pytest(tmp_path, {"test_suite.py": SUITE}, CKPT_GUARD_PARTIAL_ENV="1")
    assert done.returncode == 0, done.stdout
    assert "1 passed, 3 skipped" in done.stdout
    assert "3 skipped:\n" in done.stdout and "  1 x MaxText's venv is not built\n" in done.stdout


def test_a_module_that_skips_at_import_fails_too(tmp_path: Path) -> None:
    done = _pytest(tmp_path, {"test_gone.py": 'import pytest\npytest.importorskip("no_such_module_here")\n'
                                              "def test_never():\n    pass\n"})
    assert done.returncode != 0 and "no_such_module_here" in done.stdout
    assert "skipped, and skips are strict here: could not import 'no_such_module_here'" in done.stdout
