"""kill -9 during `ckpt-guard fix --write`: every final name is old or complete-new, inputs never change.

Two large writes, each killed at several points of its life: when its staging directory
appears, a quarter into the staged bytes, when all bytes are staged (verification and
publishing), and as soon as a final name changes.  After each kill the tree is checked
against a run that was not killed; then the same command, run again, finishes the job.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from guard.fix.apply import STAGING_PREFIX

ROOT = Path(__file__).resolve().parents[1]
TENSORS, ELEMENTS = 50, 1_000_000  # 50 x 4 MB in fp32: a 200 MB write
POINTS = ("staging", "quarter", "staged", "published")


def sha(path: Path) -> str | None:
    if not path.exists():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def final_names(model: Path) -> dict[str, str | None]:
    """Every name in the model directory but the hidden staging directories, with its contents' hash."""
    return {p.name: sha(p) for p in model.iterdir() if not p.name.startswith(STAGING_PREFIX)}


def staged_bytes(model: Path) -> int | None:
    """Bytes under the staging directories; None while there is none."""
    dirs = [p for p in model.iterdir() if p.name.startswith(STAGING_PREFIX)] if model.exists() else []
    if not dirs:
        return None
    total = 0
    for d in dirs:
        for current, _, files in os.walk(d):
            for name in files:
                try:
                    total += os.lstat(os.path.join(current, name)).st_size
                except OSError:
                    pass
    return total


def fix_command(workdir: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CI": "1", "PYTHONPATH": str(ROOT), "USE_TF": "0"}
    return subprocess.Popen([sys.executable, "-m", "guard", "fix", "m", "--write", *args], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run_until(workdir: Path, args: tuple[str, ...], point: Callable[[Path], bool], timeout: float = 300) -> bool:
    """Start the fix and SIGKILL it when ``point`` holds; False when it finished first."""
    proc = fix_command(workdir, *args)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if point(workdir / "m"):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            assert time.monotonic() < deadline, "the fix took too long"
            time.sleep(0.002)  # polling: the kill must land inside a write of about a second
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]


def run_to_end(workdir: Path, *args: str) -> int:
    proc = fix_command(workdir, *args)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 1), err.decode()[-2000:]
    return proc.returncode


def points(model: Path, output_bytes: int) -> dict[str, Callable[[Path], bool]]:
    """The kill points of one run, seen from outside: staging appears, staged bytes grow, a final name changes."""
    names = {p.name: os.lstat(p).st_ino for p in model.iterdir()}

    def staged_at_least(share: float) -> Callable[[Path], bool]:
        return lambda m: (staged_bytes(m) or 0) >= share * output_bytes

    def published(m: Path) -> bool:
        now = {p.name: os.lstat(p).st_ino for p in m.iterdir() if not p.name.startswith(STAGING_PREFIX)}
        return now != names

    return {"staging": lambda m: staged_bytes(m) is not None, "quarter": staged_at_least(0.25),
            "staged": staged_at_least(0.99), "published": published}


def hard_link_tree(src: Path, dst: Path) -> None:
    """A copy that shares the inputs' inodes: an input changed in place would show in the source too."""
    dst.mkdir(parents=True)
    for path in src.iterdir():
        os.link(path, dst / path.name)


# --- a pickle-only pytorch_model.bin: the safetensors copy (a new file) ---------------------------------

@pytest.fixture(scope="module")
def pickled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str | None]]:
    import torch

    src = tmp_path_factory.mktemp("pickled") / "m"
    src.mkdir()
    generator = torch.Generator().manual_seed(0)
    torch.save({f"layers.{i}.weight": torch.randn(ELEMENTS, generator=generator) for i in range(TENSORS)},
               src / "pytorch_model.bin")
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float32"}, indent=2))
    reference = tmp_path_factory.mktemp("pickled-reference")
    hard_link_tree(src, reference / "m")
    assert run_to_end(reference) == 0
    done = final_names(reference / "m")
    assert set(done) == {"pytorch_model.bin", "config.json", "model.safetensors"}
    return src, done


@pytest.mark.parametrize("point", POINTS)
def test_a_killed_safetensors_copy_leaves_old_or_new(pickled: tuple[Path, dict[str, str | None]], point: str,
                                                     tmp_path: Path) -> None:
    src, done = pickled
    hard_link_tree(src, tmp_path / "m")
    before = final_names(tmp_path / "m")
    killed = run_until(tmp_path, (), points(tmp_path / "m", TENSORS * ELEMENTS * 4)[point])
    if point in ("staging", "quarter"):
        assert killed, f"the fix finished before the {point} point"
    after = final_names(tmp_path / "m")
    assert after["pytorch_model.bin"] == before["pytorch_model.bin"] == sha(src / "pytorch_model.bin")
    assert after["config.json"] == before["config.json"]
    assert set(after) <= set(done)  # nothing at any other final name
    assert after.get("model.safetensors") in (None, done["model.safetensors"])  # absent, or complete
    assert run_to_end(tmp_path) == 0  # run again: it finishes, and sweeps what the killed run left
    assert final_names(tmp_path / "m") == done
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(STAGING_PREFIX)]


# --- a bf16 safetensors set cast to fp32 in place (--cast --replace), config.json following -------------

@pytest.fixture(scope="module")
def bf16_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str | None]]:
    import torch
    from safetensors.torch import save_file

    src = tmp_path_factory.mktemp("bf16") / "m"
    src.mkdir()
    generator = torch.Generator().manual_seed(1)
    save_file({f"layers.{i}.weight": torch.randn(ELEMENTS, generator=generator).to(torch.bfloat16)
               for i in range(TENSORS)}, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16"}, indent=2))
    reference = tmp_path_factory.mktemp("bf16-reference")
    hard_link_tree(src, reference / "m")
    assert run_to_end(reference, "--cast", "--replace") == 0
    done = final_names(reference / "m")
    assert set(done) == {"model.safetensors", "model.safetensors.orig", "config.json"}
    assert done["model.safetensors.orig"] == sha(src / "model.safetensors")
    assert json.loads((reference / "m" / "config.json").read_text())["torch_dtype"] == "float32"
    return src, done


@pytest.mark.parametrize("point", POINTS)
def test_a_killed_cast_in_place_leaves_old_or_new(bf16_set: tuple[Path, dict[str, str | None]], point: str,
                                                  tmp_path: Path) -> None:
    src, done = bf16_set
    hard_link_tree(src, tmp_path / "m")
    before = final_names(tmp_path / "m")
    killed = run_until(tmp_path, ("--cast", "--replace"), points(tmp_path / "m", TENSORS * ELEMENTS * 4)[point])
    if point in ("staging", "quarter"):
        assert killed, f"the fix finished before the {point} point"
    after = final_names(tmp_path / "m")
    assert sha(src / "model.safetensors") == before["model.safetensors"]  # the input's inode never changed
    assert after["model.safetensors"] in (before["model.safetensors"], done["model.safetensors"])
    assert after["config.json"] in (before["config.json"], done["config.json"])
    assert after.get("model.safetensors.orig") in (None, before["model.safetensors"])
    assert set(after) <= set(done)
    run_to_end(tmp_path, "--cast", "--replace")  # run again: the job is finished
    again = final_names(tmp_path / "m")
    assert again["model.safetensors"] == done["model.safetensors"] and again["config.json"] == done["config.json"]
    assert all(digest == before["model.safetensors"] for name, digest in again.items() if name.endswith(".orig"))
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(STAGING_PREFIX)]


def test_a_killed_config_rewrite_leaves_old_or_new(tmp_path: Path) -> None:
    """The smallest write: killed at once, or as the staging directory appears; never a partial config.json."""
    import torch
    from safetensors.torch import save_file

    model = tmp_path / "m"
    model.mkdir()
    save_file({"w": torch.zeros(8, dtype=torch.bfloat16)}, str(model / "model.safetensors"))
    old = json.dumps({"model_type": "llama", "torch_dtype": "float32", "pad": ["x" * 100] * 20000}, indent=2)
    (model / "config.json").write_text(old)  # about 2 MB: the rewrite takes a moment
    new = old.replace('"torch_dtype": "float32"', '"torch_dtype": "bfloat16"')
    for point in (lambda m: staged_bytes(m) is not None, lambda m: (staged_bytes(m) or 0) > 0):
        run_until(tmp_path, ("--expect", "bf16"), point)
        assert (model / "config.json").read_text() in (old, new)
        assert {p.name for p in model.iterdir() if not p.name.startswith(STAGING_PREFIX)} == \
            {"model.safetensors", "config.json"}
    run_to_end(tmp_path, "--expect", "bf16")
    assert (model / "config.json").read_text() == new
