"""Where managed environments live, what they are keyed by, and how a complete one is told from a half-built one.

The folder: ``$CKPT_GUARD_HOME/envs``, else ``envs`` in ckpt-guard's folder of the user's cache directory, where
platformdirs puts it: ``$XDG_CACHE_HOME/ckpt-guard`` (``~/.cache/ckpt-guard``) on Linux,
``~/Library/Caches/ckpt-guard`` on macOS, ``%LOCALAPPDATA%\\ckpt-guard\\Cache`` on Windows (where that folder is
not a cache's alone).  One folder per
environment, ``NAME-KEY``: the key hashes the row's constraints, requirements and Python (and, for a folder
beside this Python or an overlay on it, this Python's environment), so a change of any of them is another
folder, as pre-commit keys a hook's environment by its repository, revision and dependencies.  The stamp,
written last, holds what was built; a folder without it is half-built and never used.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from importlib.resources import files
from pathlib import Path
from typing import Any

from guard import jsonload
from guard.envs.registry import Environment

HOME_ENV = "CKPT_GUARD_HOME"
STAMP = "ckpt-guard-env.json"


def cache_root() -> Path:
    """ckpt-guard's folder in the user's cache directory (``$CKPT_GUARD_HOME`` overrides it)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).absolute()  # a worker runs in another folder
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "ckpt-guard" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "ckpt-guard"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ckpt-guard"


def envs_home() -> Path:
    return cache_root() / "envs"


def constraints_text(env: Environment) -> str:
    return (files("guard.envs") / env.constraints).read_text(encoding="utf-8")


def constraints_file(name: str) -> Path:
    """A constraints file's path on disk (pip reads it by name): package data is a plain file in a wheel and
    in a checkout alike."""
    return Path(str(files("guard.envs") / name))


def this_environment() -> str:
    """This Python's environment, as far as an overlay on it depends on it."""
    return f"{sys.prefix}|{sysconfig.get_path('purelib')}|{sys.version_info[0]}.{sys.version_info[1]}"


def key(env: Environment) -> str:
    digest = hashlib.sha256()
    pins = sorted(line.split("#")[0].strip() for line in constraints_text(env).splitlines())  # comments aside
    for part in (env.kind, env.python, "\n".join(env.requirements), "\n".join(p for p in pins if p)):
        digest.update(part.encode("utf-8") + b"\0")
    if env.kind == "overlay":  # its .pth names this Python's site-packages
        digest.update(this_environment().encode("utf-8"))
    elif env.kind == "lib":  # pure Python, for this Python's minor version
        digest.update(f"{sys.version_info[0]}.{sys.version_info[1]}".encode())
    return digest.hexdigest()[:16]


def managed_dir(env: Environment) -> Path:
    return envs_home() / f"{env.name}-{key(env)}"


def venv_python(directory: Path) -> Path:
    return directory / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def read_stamp(directory: Path) -> dict[str, Any] | None:
    try:
        stamp = jsonload.loads((directory / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def others(env: Environment) -> list[Path]:
    """The folders of ``env`` under other keys, and half-built ones (``.NAME-KEY.tmp-*``): what an install
    replaces and what `env remove` deletes."""
    home = envs_home()
    if not home.is_dir():
        return []
    mine = managed_dir(env).name
    return sorted(p for p in home.iterdir() if p.name != mine and (
        p.name.startswith(f"{env.name}-") and len(p.name) == len(env.name) + 17
        or p.name.startswith(f".{env.name}-") and ".tmp-" in p.name))


def size_on_disk(directory: Path) -> int:
    total = 0
    for root, dirs, names in os.walk(directory):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total
