"""`make demo`: it passes on transformers 5 with parity's Flax side on transformers 4, a step that ends otherwise
fails it, and it can run again: it rebuilds a folder it made, and never touches one it did not."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from legacy_env import legacy_python

from guard import demo
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


def test_a_step_that_ends_otherwise_fails_the_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """With no samples built, the first scan finds nothing to fail on: the demo stops there, exit 1."""
    monkeypatch.setattr(demo, "build_samples", lambda root: [])
    assert demo.main([str(tmp_path / "demo")]) == 1
    out, err = capsys.readouterr()
    assert err.strip().startswith(f"ckpt-guard demo: a step failed: `ckpt-guard scan {tmp_path / 'demo'} --no-summary`"
                                  " exited ") and err.strip().endswith(", not 1")
    assert "the fix:" not in out and not (tmp_path / "demo" / "converted").exists()


def test_run_step_holds_the_exit_code_it_was_told() -> None:
    cli = [sys.executable, "-c", "import sys; sys.exit(int(sys.argv[-1]))"]
    demo.run_step(cli, ["1"], expect=1)
    with pytest.raises(demo.StepFailed, match=r"^`ckpt-guard 2` exited 2, not 0$"):
        demo.run_step(cli, ["2"], expect=0)


@pytest.mark.slow
def test_the_demo_passes_on_transformers_5_with_flax_on_transformers_4(tmp_path: Path) -> None:
    """`make demo` as a fresh clone runs it: samples, scans, the fix, both conversions with parity (Flax in the
    managed transformers-4 environment, found as a user's: CKPT_GUARD_HOME), the converted models scanned; every
    step as the demo says, exit 0."""
    legacy_python()  # the managed transformers-4 environment is built (`make test` builds it), or this fails here
    root = tmp_path / "demo-models"
    done = subprocess.run([sys.executable, "-m", "guard.demo", str(root)], capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("== the demo ran every step as it should")
    assert len(re.findall(r"^  fp32 +ok ", done.stdout, re.M)) == 2  # both parity checks ran, and passed
    assert sorted(p.name for p in (root / "converted").iterdir()) == ["bart-flax-fp32", "mistral-flax"]
