"""Where a target's environment is: one way, for every target that runs elsewhere.

In this order:
1. the Python the user names (``--against-python`` / ``--flax-python``, or the environment variable), asked
   for the library first: a name given is never passed over;
2. this process, when it imports the library (at a version the row refuses, not at all);
3. the managed environment in the cache directory (``guard.envs.home``), built by ``ckpt-guard env install``;
4. otherwise one line naming that command, and nothing written.

A library version outside the row's checked set runs, with a warning naming both versions (``Found.warning``,
which the report's figures record).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from guard.envs.home import managed_dir, read_stamp, venv_python
from guard.envs.registry import ENVIRONMENTS, Environment
from guard.errors import UsageError
from guard.records import Record

NAMED_ENV = {"tf4": "CKPT_GUARD_FLAX_PYTHON"}  # the variable naming a target's Python; the rest share one
AGAINST_PYTHON_ENV = "CKPT_GUARD_AGAINST_PYTHON"
FLAG = {"tf4": "--flax-python"}  # the flag naming it; the rest: --against-python
PROBE_TIMEOUT_S = 120
# run by a named Python: its version, prefix and each distribution's version (None: absent), one JSON line
_PROBE = ("import importlib.metadata as m, importlib.util as u, json, sys\n"
          "def v(d, mod):\n"
          "    if mod and u.find_spec(mod) is None: return None\n"
          "    try: return m.version(d)\n"
          "    except m.PackageNotFoundError: return None if not mod else '0'\n"
          "args = json.loads(sys.argv[1])\n"
          "print(json.dumps({'python': '%d.%d.%d' % sys.version_info[:3], 'prefix': sys.prefix,\n"
          "                  'versions': {d: v(d, mod) for d, mod in args}}))\n")


class Found(Record):
    name: str
    where: str  # "named" | "this process" | "managed"
    python: Path  # the interpreter the worker runs with
    version: str  # the library's version there
    path: tuple[Path, ...] = ()  # folders the worker's path adds after the package (a "lib" environment)
    label: str = ""  # how the user named it ("--against-python X"), or the managed folder
    warning: str = ""  # the library's version is outside the checked set
    versions: Mapping[str, str | None] = MappingProxyType({})  # every distribution asked about

    @property
    def in_process(self) -> bool:
        return self.where == "this process"

    def figures(self) -> dict[str, Any]:
        figures: dict[str, Any] = {"name": self.name, "where": self.where, "python": str(self.python),
                                   "version": self.version}
        if self.path:
            figures["path"] = [str(p) for p in self.path]
        if self.warning:
            figures["warning"] = self.warning
        return figures


def flag_of(name: str) -> str:
    return FLAG.get(name, "--against-python")


def variable_of(name: str) -> str:
    return NAMED_ENV.get(name, AGAINST_PYTHON_ENV)


def install_hint(name: str) -> str:
    return f"run `ckpt-guard env install {name}`, or name its Python with {flag_of(name)}"


def find(name: str, named: Path | None = None, *, what: str = "", after: str = "",
         also: tuple[str, ...] = ()) -> Found:
    """The environment ``name`` runs in, or the one line (UsageError) saying why none can be used.
    ``also``: more distributions a named Python must hold (parity's Flax side: jax, flax)."""
    env = ENVIRONMENTS[name]
    prefix = f"{what}: " if what else ""
    label = f"{flag_of(name)} {named}" if named is not None else ""
    if named is None and os.environ.get(variable_of(name)):
        named = Path(os.environ[variable_of(name)])
        label = f"{variable_of(name)}={named}"
    if named is not None:
        return probe_named(env, named, label, prefix=prefix, after=after, also=also)
    here = version_here(env)
    if here is not None and not refused(env, here):
        return Found(name, "this process", Path(sys.executable), here, warning=version_warning(env, here, "here"))
    managed = find_managed(env)
    if managed is not None:
        return managed
    why = f"{env.distribution} {here} here: {env.why}" if here else env.why
    raise UsageError(f"{prefix}{name} is not installed ({why}): {install_hint(name)}{after}")


def version_here(env: Environment) -> str | None:
    """The library's version in this process, from its metadata (nothing imported); None when absent."""
    if importlib.util.find_spec(env.module) is None:
        return None
    try:
        return importlib.metadata.version(env.distribution)
    except importlib.metadata.PackageNotFoundError:  # a bare source tree on sys.path
        return "0"


def refused(env: Environment, version: str) -> bool:
    major = version.split(".")[0]
    return major.isdigit() and int(major) in env.refuses_major


def version_warning(env: Environment, version: str, where: str) -> str:
    if version in env.checked:
        return ""
    return (f"{env.name}: {env.distribution} {version} {where}; checked with {', '.join(env.checked)}: "
            "its verdicts may differ")


def find_managed(env: Environment) -> Found | None:
    """The managed environment, when built and complete (its stamp written last); else None."""
    directory = managed_dir(env)
    stamp = read_stamp(directory)
    if stamp is None:
        return None
    version = str(stamp.get("versions", {}).get(env.distribution) or "")
    path: tuple[Path, ...] = (directory,) if env.kind == "lib" else ()
    python = Path(sys.executable) if env.kind == "lib" else venv_python(directory)
    if not python.exists():
        return None
    return Found(env.name, "managed", python, version, path=path, label=str(directory),
                 warning=version_warning(env, version, f"in {directory}"), versions=stamp.get("versions", {}))


def probe(python: Path, distributions: list[tuple[str, str]]) -> dict[str, Any]:
    """Runs ``python`` once: its version, prefix and the distributions' versions.  OSError, ValueError or
    subprocess errors when it does not run."""
    from guard.envs.worker import worker_path

    with tempfile.TemporaryDirectory(prefix="ckpt-guard-probe-") as folder:  # the path the worker will have
        environment = {**os.environ, "PYTHONPATH": worker_path(Path(folder))}
        proc = subprocess.run([str(python), "-c", _PROBE, json.dumps(distributions)], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, env=environment, cwd=folder)
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.split()[-20:])
        raise ValueError(f"exit {proc.returncode}: {tail}" if tail else f"exit {proc.returncode}")
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    if not isinstance(answer, dict) or not isinstance(answer.get("versions"), dict):
        raise ValueError("its answer is not the probe's")
    return answer


def probe_named(env: Environment, named: Path, label: str, *, prefix: str = "", after: str = "",
                also: tuple[str, ...] = ()) -> Found:
    """A named Python, made absolute (never resolved: a venv's python is a link that must stay the venv's),
    once it answers with the library at a version the row can run."""
    python = Path(os.path.abspath(named))
    if not python.is_file():
        raise UsageError(f"{prefix}{label}: no such file{after}")
    try:
        answer = probe(python, [(env.distribution, env.module), *((d, d) for d in also)])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
        raise UsageError(f"{prefix}{label} does not run: {' '.join(str(exc).split())}{after}") from None
    versions = answer["versions"]
    missing = [d for d in (env.distribution, *also) if not versions.get(d)]
    if missing:
        raise UsageError(f"{prefix}{label} has no {', '.join(missing)} (Python {answer.get('python')} at "
                         f"{answer.get('prefix')}): {install_hint(env.name)}{after}")
    version = str(versions[env.distribution])
    if refused(env, version):
        raise UsageError(f"{prefix}{label} has {env.distribution} {version}, which {env.name} cannot run on "
                         f"({env.why}): {install_hint(env.name)}{after}")
    return Found(env.name, "named", python, version, label=label,
                 warning=version_warning(env, version, f"in {label}"), versions=versions)
