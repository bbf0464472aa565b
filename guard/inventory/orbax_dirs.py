"""Local Orbax checkpoints: a directory read as one FileScan.

A directory holding ``_METADATA`` (StandardCheckpointer) or ``_CHECKPOINT_METADATA``
plus item folders with their own ``_METADATA`` (a CheckpointManager step) is a
model of its own, and the directories inside it are not.  ``discovery`` calls
these functions (imported only when a directory holds one of those files); the
reader is ``guard.readers.orbax``.
"""

from __future__ import annotations

import os
from pathlib import Path

from guard.readers import unreadable
from guard.sources import BytesSource, LocalFile
from guard.tensors import FileScan

MAX_ORBAX_FILES = 200_000


def local_orbax(directory: str, entries: list[os.DirEntry[str]]) -> tuple[str, ...]:
    from guard.readers.orbax import CHECKPOINT_METADATA, METADATA

    names = {e.name for e in entries}
    if METADATA in names or (CHECKPOINT_METADATA in names and any(
            e.is_dir(follow_symlinks=False) and os.path.isfile(os.path.join(e.path, METADATA)) for e in entries)):
        return (directory,)
    return ()


def orbax_files(directory: str | os.PathLike[str]) -> dict[str, int]:
    """Relative POSIX path -> size of every file under an Orbax checkpoint (symlinks not followed)."""
    files: dict[str, int] = {}
    for current, dirnames, names in os.walk(directory):
        dirnames.sort()
        for name in sorted(names):
            path = Path(current, name)
            if path.is_symlink() or not path.is_file():
                continue
            files[path.relative_to(directory).as_posix()] = path.stat().st_size
            if len(files) > MAX_ORBAX_FILES:
                return files
    return files


def scan_local_orbax(directory: str | os.PathLike[str], *, name: str) -> FileScan:
    from guard.readers.orbax import is_orbax_checkpoint, read_orbax_checkpoint

    directory = Path(directory)
    files = orbax_files(directory)
    if len(files) > MAX_ORBAX_FILES:
        return unreadable(BytesSource(b"", name=name), f"more than {MAX_ORBAX_FILES:,} files in the checkpoint")
    if not is_orbax_checkpoint(files):
        return unreadable(BytesSource(b"", name=name), "no _METADATA in the Orbax checkpoint")

    opened: list[LocalFile] = []

    def open_file(relative: str) -> LocalFile:
        if relative not in files:  # the reader only opens listed files; refuse anything else
            raise KeyError(relative)
        opened.append(LocalFile(directory / relative, name=f"{name}/{relative}"))
        return opened[-1]

    try:
        return read_orbax_checkpoint(name, files, open_file, local_root=str(directory.resolve()))
    except OSError as exc:
        return unreadable(BytesSource(b"", name=name), f"read failed ({exc.strerror})")
    finally:  # one file per leaf's metadata: a checkpoint of thousands must not run out of descriptors
        for source in opened:
            source.close()
