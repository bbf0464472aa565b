"""Nothing half-written: a full disk, a read-only directory or a SIGKILL leaves no partial output.

A real full disk is a 64 KiB tmpfs where we may mount one (root on Linux); the
same cases also run everywhere with ``os.fsync`` / ``tempfile.mkstemp`` raising
ENOSPC / EROFS, which is what the kernel would say.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guard.atomic import write_text_atomic
from guard.cli import main
from guard.errors import GuardError

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _model(directory: Path, *, tensors: int = 3, side: int = 8) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    state = {f"layer{i}.weight": torch.randn(side, side, generator=torch.Generator().manual_seed(i))
             for i in range(tensors)}
    safetensors_torch.save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def _hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("ckpt-guard: error:"), err
    return lines[0]


def _mount_tmpfs(path: Path, *options: str) -> bool:
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join(("size=64k", *options))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a 64 KiB tmpfs, filled to the last block."""
    mount = tmp_path / "full"
    if not _mount_tmpfs(mount):
        pytest.skip("cannot mount a tmpfs here; the ENOSPC cases below cover it by monkeypatch")
    try:
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A read-only mount: root ignores mode bits, so chmod would prove nothing."""
    mount = tmp_path / "ro"
    if not _mount_tmpfs(mount, "ro"):
        pytest.skip("cannot mount a read-only tmpfs here; the EROFS case below covers it by monkeypatch")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# ------------------------------------------------------------------ report writes (scan -o)

def test_scan_report_on_a_full_disk(tmp_path: Path, full_disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path / "m", tensors=200)  # its JSON report is far over the free space
    target = full_disk / "report.json"
    assert main(["scan", str(model), "-f", "json", "-o", str(target)]) == 2
    line = _one_line_error(capsys)
    assert str(target) in line and "No space left" in line
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # no report, no temp file


def test_scan_report_into_a_read_only_dir(tmp_path: Path, read_only_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    target = read_only_dir / "report.sarif"
    assert main(["scan", str(_model(tmp_path / "m")), "-f", "sarif", "-o", str(target)]) == 2
    assert "Read-only file system" in _one_line_error(capsys)
    assert list(read_only_dir.iterdir()) == []


@pytest.mark.parametrize("where", ["fsync", "write"])
def test_enospc_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], where: str) -> None:
    model = _model(tmp_path / "m")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "report.json"
    target.write_text("previous report\n")

    def no_space(*_args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if where == "fsync":
        monkeypatch.setattr(os, "fsync", no_space)
    else:  # the disk fills during the write itself
        real_fdopen = os.fdopen

        class FullFile:
            def __init__(self, fd: int, *args: object, **kwargs: object) -> None:
                self.raw = real_fdopen(fd, *args, **kwargs)  # type: ignore[arg-type]

            def __enter__(self) -> FullFile:
                return self

            def __exit__(self, *exc: object) -> None:
                self.raw.close()

            def write(self, data: bytes) -> int:
                self.raw.write(data[: len(data) // 2])
                no_space()
                return 0

        monkeypatch.setattr(os, "fdopen", FullFile)
    assert main(["scan", str(model), "-f", "json", "-o", str(target)]) == 2
    assert "No space left on device" in _one_line_error(capsys)
    assert target.read_text() == "previous report\n"  # the old report survives whole
    assert sorted(p.name for p in out_dir.iterdir()) == ["report.json"]


def test_erofs_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    import tempfile

    def read_only(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    target = tmp_path / "report.txt"
    assert main(["scan", str(_model(tmp_path / "m")), "-o", str(target)]) == 2
    assert "Read-only file system" in _one_line_error(capsys)
    assert not target.exists()


def test_write_text_atomic_cleans_up_on_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(tmp_path / "r.md", "x" * 100_000)
    assert list(tmp_path.iterdir()) == []


def test_write_text_atomic_missing_directory_is_a_guard_error(tmp_path: Path) -> None:
    with pytest.raises(GuardError, match="cannot write"):
        write_text_atomic(tmp_path / "no" / "such" / "r.json", "{}")


# ------------------------------------------------------------------ SIGKILL mid-conversion

KILL_POINTS = ("temp-dir-created", "shard-half-written", "shard-fully-written")


def _wait_for(predicate, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)  # polling a file system event: there is nothing to wait on
    return False


@pytest.fixture(scope="module")
def big_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # ~42 MB: large enough that the shard write takes a measurable slice of a second. Named as a
    # LlamaModel's MLP layers with a config, as convert refuses tensors of no known architecture.
    directory = tmp_path_factory.mktemp("src") / "model"
    directory.mkdir(parents=True)
    state = {f"layers.{i}.mlp.down_proj.weight": torch.randn(512, 512, generator=torch.Generator().manual_seed(i))
             for i in range(40)}
    safetensors_torch.save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaModel"], "hidden_size": 512, "intermediate_size": 512,
        "num_hidden_layers": 40, "num_attention_heads": 8, "vocab_size": 32}))
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["msgpack", "orbax"])
@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_mid_conversion_leaves_no_partial_output(tmp_path: Path, big_source: Path, point: str,
                                                         layout: str) -> None:
    pytest.importorskip("flax")
    out = tmp_path / "converted"
    proc = subprocess.Popen([sys.executable, "-m", "guard", "convert", str(big_source), "--to", "flax",
                             "--layout", layout, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def partial_dirs() -> list[Path]:
            return [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}.")]

        def shard_bytes() -> int:  # Orbax writes a directory per tensor
            return sum(f.stat().st_size for d in partial_dirs() for f in d.rglob("*") if f.is_file())

        expected = (big_source / "model.safetensors").stat().st_size
        reached = _wait_for({
            "temp-dir-created": lambda: bool(partial_dirs()),
            "shard-half-written": lambda: shard_bytes() > expected // 2,
            "shard-fully-written": lambda: shard_bytes() >= expected - 4096,
        }[point], proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not reached:
        pytest.skip(f"the conversion finished before {point}")  # nothing left to interrupt
    # The output name holds nothing, or a complete, readable conversion: never a partial one.
    if out.exists() and layout == "orbax":
        ocp = pytest.importorskip("orbax.checkpoint")
        assert len(ocp.StandardCheckpointer().restore(out.resolve())) == 40
    elif out.exists():
        assert main(["scan", str(out), "-f", "json", "-o", str(tmp_path / "r.json")]) in (0, 1)
        report = json.loads((tmp_path / "r.json").read_text())
        assert not [f for f in report["findings"] if f["code"] == "CG001"]
        assert sum(f["tensors"] for m in report["models"] for f in m["files"]) == 40


def test_an_output_that_is_not_a_regular_file_is_written_in_place(tmp_path: Path) -> None:
    """`-o /dev/null` or a FIFO: renaming over it would replace the device with a file."""
    import threading

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_text_atomic(fifo, "report\n")
    reader.join(timeout=10)
    assert got == [b"report\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["out.fifo"]  # no temporary left beside it
