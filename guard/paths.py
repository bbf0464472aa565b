"""Local paths as plain strings, spelled as pathlib spells them on POSIX.

The scan's own path (discovery, the pre-commit hook) keeps paths as strings: pathlib, with the
urllib.parse and ipaddress modules it imports, costs a hook call about 3 ms of CPU (of ~35 ms).
Commands that write files (convert, fix) use pathlib as usual.
"""

from __future__ import annotations

import os


def clean_path(path: str | os.PathLike[str]) -> str:
    """``str(Path(path))`` on POSIX: no repeated separators, no ``.`` parts, no trailing separator."""
    text = os.fspath(path)
    if "//" not in text and "/." not in text and not text.startswith("./") and not text.endswith("/") and text:
        return text  # already clean (the hook's file names, scandir's paths)
    root = "//" if text.startswith("//") and not text.startswith("///") else "/" if text.startswith("/") else ""
    parts = [part for part in text.split("/") if part and part != "."]
    return root + "/".join(parts) if root or parts else "."


def path_name(path: str) -> str:
    """``Path(path).name`` of a clean path."""
    return "" if path == "." else path.rpartition("/")[2]


def path_parent(path: str) -> str:
    """``str(Path(path).parent)`` of a clean path."""
    head, sep, name = path.rpartition("/")
    if not sep:
        return "."
    if not name or not head.strip("/"):  # the root itself, or a name right under it
        return path[:len(path) - len(name)] if name else path
    return head
