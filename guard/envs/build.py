"""``ckpt-guard env install NAME``: a managed environment, built from the row's constraints (package data).

uv where it is on PATH (``uv venv``, ``uv pip install --python``), else ``python -m venv`` and pip.  The build
goes into ``.NAME-KEY.tmp-PID`` beside its final name; the stamp is written last, then the folder is renamed
into place, so a build cut short is a folder without a stamp: never used, and removed by the next install.
Kinds (``guard.envs.registry``):
- "venv": a venv of its own, with the row's Python (MaxText's 3.12: on PATH, in pyenv, or through uv);
- "lib": the library alone (``pip install --no-deps --target``), put on this Python's path by the worker;
- "overlay": a venv whose .pth file adds this Python's site-packages *after* its own, holding only the pins
  that differ from what this Python has (transformers 4.57 and what moves with it: ~60 MB, not a second
  torch, jax and TensorFlow).  pip sees this Python's packages while it installs, so it adds only those.
pip runs with ``--no-compile``, as uv does by default: a module is compiled when first imported, and an install
spends no time on the ~20,000 modules of a stack it never imports (~4 ms each here: ~80 s of an environment's
build on a 2-core machine).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from guard.envs.home import (
    STAMP,
    constraints_file,
    envs_home,
    managed_dir,
    others,
    read_stamp,
    size_on_disk,
    venv_python,
)
from guard.envs.registry import Environment
from guard.errors import UsageError

PIP_TIMEOUT_S = 3600
# run by the built environment: the versions of the library and of every pinned distribution it holds
_VERSIONS = ("import importlib.metadata as m, json, re\n"
             "print(json.dumps({re.sub('[-_.]+', '-', d.metadata['Name']).lower(): d.version\n"
             "                  for d in reversed(list(m.distributions()))}))\n")  # the first on the path wins


def install(env: Environment, *, say: Callable[[str], None] = print) -> Path:
    """The managed environment's folder, built unless complete already (then nothing is done)."""
    final = managed_dir(env)
    if read_stamp(final) is not None:
        say(f"{env.name}: ready in {final}")
        return final
    running = [p for p in others(env) if _building_pid(p)]
    if running:
        raise UsageError(f"env install {env.name}: another install is under way (pid {_building_pid(running[0])}, "
                         f"{running[0]}): run it again when it is done")
    for stale in [*others(env), *([final] if final.exists() else [])]:  # other keys, half-built folders
        say(f"{env.name}: removing {stale.name} ({'another key' if stale.name[0] != '.' else 'half-built'})"
            if stale != final else f"{env.name}: removing {final.name} (half-built: no stamp)")
        shutil.rmtree(stale, ignore_errors=True)
    envs_home().mkdir(parents=True, exist_ok=True)
    work = final.parent / f".{final.name}.tmp-{os.getpid()}"
    started = time.perf_counter()
    try:
        python = _build(env, work, say)
        if env.kind == "lib":
            versions = _folder_versions(work)
        else:
            versions = json.loads(_run([str(python), "-c", _VERSIONS], env.name, "reading its versions").strip()
                                  .splitlines()[-1])
        library = versions.get(_normal(env.distribution))
        if not library:
            raise UsageError(f"env install {env.name}: {env.distribution} is not in the environment built")
        stamp = {"name": env.name, "key": final.name.rsplit("-", 1)[1], "kind": env.kind, "python": str(python),
                 "versions": {env.distribution: library, **versions},
                 "seconds": round(time.perf_counter() - started, 1), "built": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                           time.gmtime())}
        (work / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
        try:
            os.replace(work, final)
        except OSError:  # another install finished first: its folder stands
            if read_stamp(final) is None:
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    say(f"{env.name}: built in {final} ({time.perf_counter() - started:.0f} s, "
        f"{size_on_disk(final) / 1e6:.0f} MB)")
    return final


def _building_pid(folder: Path) -> int | None:
    """The pid of the live process building into ``folder`` (``.NAME-KEY.tmp-PID``), else None."""
    head, sep, pid = folder.name.rpartition(".tmp-")
    if not sep or not pid.isdigit() or int(pid) == os.getpid():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except OSError:  # alive, another user's
        return int(pid)
    return int(pid)


def remove(env: Environment) -> list[Path]:
    gone = [p for p in [managed_dir(env), *others(env)] if p.exists()]
    for folder in gone:
        shutil.rmtree(folder)
    return gone


def _build(env: Environment, work: Path, say: Callable[[str], None]) -> Path:
    """Builds into ``work``; returns the Python that runs it."""
    constraints = str(constraints_file(env.constraints))
    uv = shutil.which("uv")
    if env.kind == "lib":
        say(f"{env.name}: {' '.join(env.requirements)} alone into {work.name}, beside {sys.executable}")
        args = ["--no-deps", "--target", str(work), "-c", constraints, *env.requirements]
        if _has_pip(Path(sys.executable)):
            _run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args], env.name)
        elif uv:
            _run([uv, "pip", "install", "--python", sys.executable, *args], env.name)
        else:
            raise UsageError(f"env install {env.name}: {sys.executable} has no pip, and uv is not on PATH")
        return Path(sys.executable)
    base = python_for(env)
    if env.kind == "overlay":
        return _overlay(env, work, base, constraints, say)
    say(f"{env.name}: a venv with {base} ({'uv' if uv else 'venv + pip'}), {' '.join(env.requirements)} "
        f"under {env.constraints}")
    if uv:
        _run([uv, "venv", "-q", "--python", str(base), str(work)], env.name, "creating the venv")
        python = venv_python(work)
        _run([uv, "pip", "install", "-q", "--python", str(python), "-c", constraints, *env.requirements], env.name)
    else:
        _run([str(base), "-m", "venv", str(work)], env.name, "creating the venv")
        python = venv_python(work)
        _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-compile", "-c", constraints,
              *env.requirements], env.name)
    return python


def _overlay(env: Environment, work: Path, base: Path, constraints: str, say: Callable[[str], None]) -> Path:
    say(f"{env.name}: an overlay on {sys.prefix}: {' '.join(env.requirements)} under {env.constraints}, and "
        "only what differs")
    _run([str(base), "-m", "venv", str(work)], env.name, "creating the venv")
    python = venv_python(work)
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env.name).strip()
    # addsitedir, not a bare path line: this environment's own .pth files (an editable install) are read too;
    # the name sorts after the overlay's own .pth files
    below = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in dict.fromkeys(below))
    Path(site, "zz-ckpt-guard-base.pth").write_text(lines, encoding="utf-8")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-compile", "-c", constraints]
    _run([*pip, *env.requirements], env.name)
    # what moves with it: a package of this environment that the overlay's versions now break (diffusers 0.42
    # needs huggingface_hub 1, transformers 4.57 caps it below 1) at the version the constraints pin
    moved = _broken_pins(python, Path(constraints))
    if moved:
        say(f"{env.name}: and what moves with it: {' '.join(moved)}")
        _run([*pip, *moved], env.name)
    return python


def _broken_pins(python: Path, constraints: Path) -> list[str]:
    """The constraints' pins of the distributions ``pip check`` finds broken in ``python``'s environment."""
    proc = subprocess.run([str(python), "-m", "pip", "check", "--disable-pip-version-check"], capture_output=True,
                          text=True)
    broken = {_normal(line.split()[0]) for line in proc.stdout.splitlines() if " has requirement " in line}
    pins = _pins(constraints)
    return sorted(f"{name}=={pins[name]}" for name in broken if name in pins)


def _pins(constraints: Path) -> dict[str, str]:
    pins = {}
    for line in constraints.read_text(encoding="utf-8").splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[_normal(name)] = version.strip()
    return pins


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _folder_versions(folder: Path) -> dict[str, str]:
    versions = {}
    for info in folder.glob("*.dist-info"):
        name, _, version = info.name[:-len(".dist-info")].partition("-")
        versions[_normal(name)] = version
    return versions


def python_for(env: Environment) -> Path:
    """The Python a venv is made with: this one when any will do, else the row's minor version, found on PATH,
    in pyenv's versions, or by uv; none is one line."""
    if not env.python or env.python == f"{sys.version_info[0]}.{sys.version_info[1]}":
        return Path(getattr(sys, "_base_executable", sys.executable))
    candidates = [shutil.which(f"python{env.python}")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(glob.glob(os.path.join(root, "versions", f"{env.python}*", "bin", f"python{env.python}")),
                             reverse=True)
    uv = shutil.which("uv")
    if uv:
        proc = subprocess.run([uv, "python", "find", env.python], capture_output=True, text=True)
        candidates.append(proc.stdout.strip() if proc.returncode == 0 else None)
    for candidate in filter(None, candidates):
        proc = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip() == env.python:
            return Path(candidate)
    raise UsageError(f"env install {env.name}: needs Python {env.python} ({env.why}); none found on PATH, in "
                     "pyenv or through uv: install one (e.g. `uv python install 3.12`)")


def _has_pip(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "import pip"], capture_output=True).returncode == 0


def _run(command: list[str], name: str, doing: str = "installing") -> str:
    """stdout; a failure is one line: the tool's own error line (pip's ``ERROR: ...``), exit 2."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"env install {name}: {doing}: {exc}") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
        # pip's own account: where it looked, what it could not reach or find, its ERROR lines
        said = [ln for ln in lines if ln.startswith(("Looking in indexes", "ERROR", "error"))
                or any(k in ln.lower() for k in ("no matching distribution", "connection", "could not fetch url"))]
        text = " ".join(dict.fromkeys(said or lines[-3:] or [f"exit {proc.returncode}"]))
        # pip quotes a constraint's source ("from -c <file>"): the file's name, never a path inside the package
        text = text.replace(str(constraints_file("constraints.txt").parent) + os.sep, "")
        raise UsageError(f"env install {name}: {doing} failed: {' '.join(text.split())[:700]}")
    return proc.stdout
