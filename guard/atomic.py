"""Nothing lost: write to a temporary name in the target directory, then rename.

A target that exists and is not a regular file (``-o /dev/null``, a FIFO, ``/dev/stdout``) is written
in place: renaming over it would replace the device with a file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from guard.errors import GuardError


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    target = Path(path)
    if _is_special(target):
        try:
            with open(target, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise GuardError(f"{target}: cannot write ({exc.strerror})") from None
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    except OSError as exc:
        raise GuardError(f"{target}: cannot write ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise GuardError(f"{target}: cannot write ({exc.strerror})") from None
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _is_special(target: Path) -> bool:
    import stat

    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False  # absent (or unreachable): the temporary name and rename report it
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
