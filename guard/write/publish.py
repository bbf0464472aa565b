"""The output directory's life: a hidden temporary sibling, renamed into place only when verified."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from guard.errors import GuardError


def fsync_paths(paths: list[Path]) -> None:
    """Files (their data), or directories (so that new names are durable before a rename publishes them)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def make_temp_dir(out: Path) -> Path:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        temp = out.parent / f".{out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
        temp.mkdir()
    except OSError as exc:
        raise GuardError(f"{out}: cannot create the output directory ({exc.strerror})") from None
    return temp


def publish(temp: Path, out: Path) -> None:
    """Rename the finished directory into place (an existing empty ``out`` is replaced).

    The files carried next to the weights (config.json, ...) are fsynced here; the weights were already.
    """
    try:
        fsync_paths([p for p in temp.iterdir() if p.is_file() and not p.is_symlink()] + [temp])
        os.replace(temp, out)
    except OSError as exc:
        raise GuardError(f"{out}: cannot move the finished output into place ({exc.strerror})") from None
    try:  # the output is in place and complete; only the rename's own durability is left
        fsync_paths([out.parent])
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the data files were fsynced


def discard(temp: Path) -> None:
    shutil.rmtree(temp, ignore_errors=True)
