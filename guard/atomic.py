"""Nothing lost: write to a temporary name in the target directory, then rename.

A target that exists and is not a regular file (``-o /dev/null``, a FIFO, ``/dev/stdout``) is written
in place: renaming over it would replace the device with a file.

The file gets the mode a plain ``open(path, "w")`` would give it (0666 less the umask), or the mode of
the file it replaces: the temporary name's 0600 is for the moment it is being written, not for the user.
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
        os.chmod(tmp, _final_mode(target))
        os.replace(tmp, target)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise GuardError(f"{target}: cannot write ({exc.strerror})") from None
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _final_mode(target: Path) -> int:
    try:
        return os.stat(target).st_mode & 0o7777  # a report written again keeps the mode its owner gave it
    except OSError:
        return 0o666 & ~current_umask()


def current_umask() -> int:
    """The process's umask: Linux shows it in /proc; elsewhere it is set and set back (the only way to read it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
