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
  What a row borrows (torch) is this Python's, whichever build the user chose: never installed, its pin
  left out of the constraints pip reads, so a CPU check never downloads PyPI's CUDA torch and its nvidia-*.
Before the stamp, the environment is run: the imports the worker makes there and the row's tiny forward
(``smoke``); a failure is one line naming what is missing and the command that installs it.
pip runs with ``--no-compile``, as uv does by default: a module is compiled when first imported, and an install
spends no time on the ~20,000 modules of a stack it never imports (~4 ms each here: ~80 s of an environment's
build on a 2-core machine).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


CPU_TORCH = "--index-url https://download.pytorch.org/whl/cpu"
SMOKE_TIMEOUT_S = 900
# run by the built environment with the worker's path: the row's imports, then its smoke function; a missing
# module is a line of its own ("missing: NAME") for the parent to name
_SMOKE = ("import importlib, json, sys\n"
          "args = json.loads(sys.argv[1])\n"
          "for name in args['imports']:\n"
          "    try: importlib.import_module(name)\n"
          "    except ModuleNotFoundError as exc:\n"
          "        print('missing:', exc.name or name, 'importing', name, file=sys.stderr); sys.exit(3)\n"
          "if args['smoke']:\n"
          "    module, _, function = args['smoke'].partition(':')\n"
          "    print(getattr(importlib.import_module(module), function)())\n")


def install(env: Environment, *, say: Callable[[str], None] = print) -> Path:
    """The managed environment's folder, built unless complete already (then nothing is done)."""
    final = managed_dir(env)
    stamp = read_stamp(final)
    if stamp is not None:
        say(f"{env.name}: ready in {final} ({describe(stamp, final)})")
        return final
    missing = [name for name in env.borrows if not _here(name)]
    if missing:
        raise UsageError(f"env install {env.name}: uses this Python's {', '.join(missing)} (whichever build you "
                         f"chose: a CPU check needs no CUDA wheels), and {sys.executable} has none: install the "
                         f"CPU build first: `{sys.executable} -m pip install {' '.join(missing)} {CPU_TORCH}`")
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
        installed = _own_distributions(work, python, env)
        said = smoke(env, python, (work,) if env.kind == "lib" else ())
        stamp = {"name": env.name, "key": final.name.rsplit("-", 1)[1], "kind": env.kind, "python": str(python),
                 "versions": {env.distribution: library, **versions}, "installed": installed,
                 "borrowed": {name: versions.get(_normal(name)) for name in env.borrows}, "checked": said,
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
    say(f"{env.name}: ready in {final}, built in {time.perf_counter() - started:.0f} s "
        f"({describe(stamp, final)})")
    return final


def describe(stamp: dict[str, Any], folder: Path) -> str:
    """What an environment holds, in a few words: its size on disk, what it installed, what it borrows."""
    installed = stamp.get("installed")
    parts = [f"{size_on_disk(folder) / 1e6:,.0f} MB on disk"]
    if isinstance(installed, dict):  # what its install downloaded: the rest is the Python's it sits on
        named = ", ".join(f"{k} {v}" for k, v in list(installed.items())[:4])
        more = f" and {len(installed) - 4} more" if len(installed) > 4 else ""
        parts.append(f"installed {len(installed)}: {named}{more}" if installed else "installed nothing")
    borrowed = stamp.get("borrowed")
    if isinstance(borrowed, dict) and borrowed:
        parts.append("this Python's " + ", ".join(f"{k} {v}" for k, v in borrowed.items()))
    return ", ".join(parts)


def _here(distribution: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _own_distributions(work: Path, python: Path, env: Environment) -> dict[str, str]:
    """The distributions the build put in its own folder (an overlay's, not the Python's it sits on)."""
    if env.kind == "lib":
        return _folder_versions(work)
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env.name,
                "reading its folder").strip().splitlines()[-1]
    return {name: version for name, version in sorted(_folder_versions(Path(site)).items())
            if name not in ("pip", "setuptools")}


def smoke(env: Environment, python: Path, extra_path: tuple[Path, ...] = ()) -> str:
    """Runs the environment as the worker will (its Python, the worker's path and variables): the row's imports,
    then its tiny forward.  A failure is one line naming what is missing and the command that installs it."""
    import tempfile

    from guard.envs.worker import worker_path

    with tempfile.TemporaryDirectory(prefix="ckpt-guard-smoke-") as folder:
        environment = {**os.environ, **env.env, "PYTHONPATH": worker_path(Path(folder), extra_path)}
        try:
            proc = subprocess.run([str(python), "-c", _SMOKE, json.dumps({"imports": env.imports,
                                                                            "smoke": env.smoke})],
                                  capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, env=environment, cwd=folder)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UsageError(f"env install {env.name}: the environment built does not run: {exc}") from None
    if proc.returncode == 0:
        return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "imports"
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    missing = next((ln.split()[1] for ln in lines if ln.startswith("missing: ")), None)
    if missing is not None:
        top = missing.split(".")[0]
        fix = (f"`{sys.executable} -m pip install torch {CPU_TORCH}` (the CPU build)" if top == "torch" else
               f"`{sys.executable} -m pip install {_DISTRIBUTION.get(top, top)}`" if env.kind in ("overlay", "lib")
               else f"`ckpt-guard env remove {env.name}` and install it again")
        raise UsageError(f"env install {env.name}: the environment built does not run: no module named {missing!r} "
                         f"(imported by the worker there): {fix}")
    tail = " ".join(" ".join(lines[-3:]).split())[:400] or f"exit {proc.returncode}"
    check = env.smoke or "the imports"
    raise UsageError(f"env install {env.name}: the environment built does not run its check ({check}): {tail}")


# a module the worker imports -> the distribution that installs it, where the names differ
_DISTRIBUTION = {"PIL": "Pillow", "keras_hub": "keras-hub", "tunix": "google-tunix", "sklearn": "scikit-learn"}


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
    uv = shutil.which("uv")
    what = ", ".join(env.requirements)
    if env.kind == "lib":
        say(f"{env.name}: {what} alone into {work.name}, beside {sys.executable}")
        steps = install_steps(env, work)
        if _has_pip(Path(sys.executable)):
            for args in steps:
                _run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args], env.name)
        elif uv:
            for args in steps:
                _run([uv, "pip", "install", "--python", sys.executable, *args], env.name)
        else:
            raise UsageError(f"env install {env.name}: {sys.executable} has no pip, and uv is not on PATH")
        return Path(sys.executable)
    base = python_for(env)
    if env.kind == "overlay":
        return _overlay(env, work, base, say)
    say(f"{env.name}: a venv with {base} ({'uv' if uv else 'venv + pip'}): {what} at the versions ckpt-guard was "
        "tested with")
    if uv:
        _run([uv, "venv", "-q", "--python", str(base), str(work)], env.name, "creating the venv")
        python = venv_python(work)
        for args in install_steps(env, work):
            _run([uv, "pip", "install", "-q", "--python", str(python), *args], env.name)
    else:
        _run([str(base), "-m", "venv", str(work)], env.name, "creating the venv")
        python = venv_python(work)
        for args in install_steps(env, work):
            _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-compile", *args],
                 env.name)
    return python


def install_steps(env: Environment, work: Path) -> list[list[str]]:
    """The arguments of each ``pip install`` the build runs, in order (``install`` runs them; a test gives them
    to ``pip install --dry-run --report`` to see what they download).  The constraints pip reads are the row's
    pins without those of what it borrows, written into ``work`` (created if need be)."""
    constraints = pins_file(env, work)
    rest = [r for r in env.requirements if r not in env.no_deps]
    steps = [["--no-deps", "-c", str(constraints), *env.no_deps]] if env.no_deps else []
    if env.kind == "lib":
        return [["--no-deps", "--target", str(work), "-c", str(constraints), *env.requirements]]
    if rest:
        steps.append(["-c", str(constraints), *rest])
    return steps


def pins_file(env: Environment, work: Path) -> Path:
    """The row's constraints without the pins of what it borrows (this Python's own, whichever build), in
    ``work``, named as the row's file (pip's messages quote it)."""
    borrowed = {_normal(name) for name in env.borrows}
    lines = [line for line in constraints_file(env.constraints).read_text(encoding="utf-8").splitlines()
             if _normal(line.split("#")[0].split("==")[0].strip()) not in borrowed]
    work.mkdir(parents=True, exist_ok=True)
    path = work / env.constraints
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _overlay(env: Environment, work: Path, base: Path, say: Callable[[str], None]) -> Path:
    borrowed = f"; this Python's {', '.join(env.borrows)}" if env.borrows else ""
    say(f"{env.name}: an overlay on {sys.prefix}: {', '.join(env.requirements)} at the versions ckpt-guard was tested "
        f"with, only what differs{borrowed}")
    _run([str(base), "-m", "venv", str(work)], env.name, "creating the venv")
    python = venv_python(work)
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env.name).strip()
    # addsitedir, not a bare path line: this environment's own .pth files (an editable install) are read too;
    # the name sorts after the overlay's own .pth files
    below = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in dict.fromkeys(below))
    Path(site, "zz-ckpt-guard-base.pth").write_text(lines, encoding="utf-8")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-compile"]
    for args in install_steps(env, work):
        _run([*pip, *args], env.name)
    # what moves with it: a package of this environment that the overlay's versions now break (diffusers 0.42
    # needs huggingface_hub 1, transformers 4.57 caps it below 1) at the version the constraints pin
    constraints = pins_file(env, work)
    moved = _broken_pins(python, constraints)
    if moved:
        say(f"{env.name}: and what moves with it: {' '.join(moved)}")
        _run([*pip, "-c", str(constraints), *moved], env.name)
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
        # pip quotes a constraint's source ("from -c <file>"): ckpt-guard's pins, never a file inside the package
        text = re.sub(r"-c \S*?([\w.-]+)\.txt\b", r"ckpt-guard's \1 pins", text)
        raise UsageError(f"env install {name}: {doing} failed: {' '.join(text.split())[:700]}")
    return proc.stdout
