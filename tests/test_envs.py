"""Environments targets run in (guard.envs): found in one order, built by `ckpt-guard env install`, and a check that
cannot run for want of one is exit 2 with one line, never a note and a pass.

Bad input (one line, exit 2 each): a named Python that does not run, one without the library, a managed environment
whose build stopped halfway (never used; the next install starts over), an install with the registry unreachable.
Isolation: the worker's PYTHONPATH, recorded by a wrapper given as --against-python, holds folders with `guard` alone.
The silent pass: --flax-python naming transformers 4 runs the Flax side there; the same environment with
transformers 5 put first is exit 2 and no output, whether the probe sees it or only the worker does.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from guard.cli import main
from guard.envs import home
from guard.envs.find import find, find_managed
from guard.envs.registry import ENVIRONMENTS
from guard.envs.worker import PACKAGE_DIR, worker_path
from guard.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT_HOME = os.environ.get("CKPT_GUARD_HOME", str(ROOT / ".envs"))  # where `make test` built them


@pytest.fixture
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CKPT_GUARD_HOME", str(tmp_path / "home"))
    for name in ("CKPT_GUARD_AGAINST_PYTHON", "CKPT_GUARD_FLAX_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("ckpt-guard: error:")]
    assert len(lines) == 1, err
    return lines[0]


def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip with no registry but one that refuses connections (fast, and no wheel folder or cache to fall back on)."""
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")


# ---- where they live, and how they are keyed


@pytest.mark.parametrize("platform", ["linux", "darwin", "win32"])
def test_the_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platform: str) -> None:
    """platformdirs' user cache directory on each platform (sys.platform patched: the code reads it, and the
    environment, at each call), $CKPT_GUARD_HOME over all of them."""
    monkeypatch.delenv("CKPT_GUARD_HOME", raising=False)
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # Path.home() on the POSIX machine the test runs on
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    expected = {"linux": tmp_path / "xdg" / "ckpt-guard",  # XDG_CACHE_HOME is Linux's alone
                "darwin": tmp_path / "user" / "Library" / "Caches" / "ckpt-guard",
                "win32": tmp_path / "local" / "ckpt-guard" / "Cache"}[platform]
    assert home.envs_home() == expected / "envs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("LOCALAPPDATA")
    unset = {"linux": tmp_path / "user" / ".cache" / "ckpt-guard",
             "darwin": tmp_path / "user" / "Library" / "Caches" / "ckpt-guard",
             "win32": tmp_path / "user" / "AppData" / "Local" / "ckpt-guard" / "Cache"}[platform]
    assert home.envs_home() == unset / "envs"
    assert home.venv_python(tmp_path) == tmp_path / ("Scripts/python.exe" if platform == "win32" else "bin/python")
    monkeypatch.setenv("CKPT_GUARD_HOME", str(tmp_path / "mine"))
    assert home.envs_home() == tmp_path / "mine" / "envs"
    monkeypatch.chdir(tmp_path)  # a relative one (CKPT_GUARD_HOME=.envs) is the folder it names from here: a
    monkeypatch.setenv("CKPT_GUARD_HOME", ".envs")  # worker runs elsewhere and must find the same folder
    assert home.envs_home() == tmp_path / ".envs" / "envs"


def test_constraints_are_package_data_and_keys_follow_the_pins() -> None:
    for env in ENVIRONMENTS.values():
        text = home.constraints_text(env)
        assert f"{env.distribution}==" in text.replace("_", "-") or env.name == "tf4" and "transformers==4." in text
        assert env.checked[0] in text or env.name == "tf4" and f"transformers=={env.checked[0]}" in text
    assert not list(ROOT.glob("constraints*.txt"))  # the top level keeps none: the wheel's are the ones used
    keys = {home.key(env) for env in ENVIRONMENTS.values()}
    assert len(keys) == len(ENVIRONMENTS)


def test_the_worker_path_holds_the_package_alone(tmp_path: Path) -> None:
    path = worker_path(tmp_path / "p", (tmp_path / "lib",)).split(os.pathsep)
    assert path == [str(tmp_path / "p"), str(tmp_path / "lib")]
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["guard"]
    assert (tmp_path / "p" / "guard").resolve() == PACKAGE_DIR
    assert PACKAGE_DIR.parent not in map(Path, path)


# ---- not there: one line naming the command, nothing written


def test_missing_environments_name_the_command(empty_home: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    out = tmp_path / "r.json"
    assert main(["parity", str(tmp_path / "m"), "--against", "tunix", "-o", str(out)]) == 2
    line = error_line(capsys.readouterr().err)
    assert "run `ckpt-guard env install tunix`, or name its Python with --against-python" in line
    assert "make " not in line and str(ROOT) not in line and not out.exists()
    with pytest.raises(UsageError, match=r"ckpt-guard env install easydel"):
        find("easydel")


def test_env_list_says_where_each_would_run(empty_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "list", "-f", "json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(ENVIRONMENTS)
    assert not rows["tunix"]["ready"] and str(empty_home) in rows["tunix"]["where"]
    assert main(["env", "list"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in ENVIRONMENTS) and "ckpt-guard env install maxtext" in text
    assert main(["env", "python", "tunix"]) == 2
    assert "ckpt-guard env install tunix" in error_line(capsys.readouterr().err)


def test_env_list_shows_a_ready_one_with_its_version_and_size(empty_home: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A managed environment whose stamp is written (an overlay: its Python, here a link to this one) is listed as
    ready, with the version its stamp records and its size on disk; `env remove` deletes it."""
    import importlib.util

    if importlib.util.find_spec("keras_hub") is not None:
        pytest.skip("keras-hub is importable here: this process would be where it runs")
    env = ENVIRONMENTS["keras-hub"]
    folder = home.managed_dir(env)
    python = home.venv_python(folder)
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    (folder / "weights.bin").write_bytes(b"\0" * 3_000_000)
    installed = {"keras-hub": "0.32.0", "sentencepiece": "0.2.3"}
    (folder / home.STAMP).write_text(json.dumps({"name": env.name, "versions": {env.distribution: "0.32.0"},
                                                 "installed": installed}))
    assert main(["env", "list", "-f", "json"]) == 0
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)}["keras-hub"]
    assert row["ready"] is True and row["version"] == "0.32.0" and row["where"] == f"managed: {folder}"
    assert row["size"] >= 3_000_000 and row["installed"] == installed and "note" not in row
    assert main(["env", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["NAME", "STATE", "VERSION", "SIZE", "INSTALLED", "WHERE"]
    line = next(ln for ln in lines if ln.startswith("keras-hub"))
    assert line.split()[:6] == ["keras-hub", "ready", "0.32.0", "3", "MB", "2"] and f"managed: {folder}" in line
    assert main(["env", "python", "keras-hub"]) == 0 and capsys.readouterr().out.strip() == str(python)
    assert main(["env", "remove", "keras-hub"]) == 0 and not folder.exists()


# ---- bad input: one line, exit 2


def test_a_named_python_that_does_not_run(empty_home: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    broken = script(tmp_path / "python", "echo 'cannot start' >&2; exit 3\n")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert main(["parity", str(tmp_path / "m"), "--against", "tunix", "--against-python", str(broken)]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"--against-python {broken} does not run: exit 3: cannot start" in line
    assert main(["parity", str(tmp_path / "m"), "--against", "tunix", "--against-python", str(tmp_path / "no")]) == 2
    assert f"--against-python {tmp_path / 'no'}: no such file" in error_line(capsys.readouterr().err)


def test_a_named_python_without_the_library(empty_home: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert main(["parity", str(tmp_path / "m"), "--against", "tunix", "--against-python", sys.executable]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"--against-python {sys.executable} has no google-tunix" in line
    assert line.endswith("run `ckpt-guard env install tunix`, or name its Python with --against-python")


def test_a_version_outside_the_checked_set_runs_with_a_warning(empty_home: Path, tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    (lib / "keras_hub").mkdir(parents=True)
    (lib / "keras_hub" / "__init__.py").write_text("")
    (lib / "keras_hub-0.31.0.dist-info").mkdir()
    (lib / "keras_hub-0.31.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: keras-hub\n"
                                                                 "Version: 0.31.0\n")
    python = script(tmp_path / "python", f'PYTHONPATH="$PYTHONPATH:{lib}" exec "{sys.executable}" "$@"\n')
    found = find("keras-hub", python)
    assert found.where == "named" and found.version == "0.31.0"
    assert found.warning == (f"keras-hub: keras-hub 0.31.0 in --against-python {python}; checked with 0.32.0: its "
                             "verdicts may differ")
    assert found.figures()["warning"] == found.warning


def test_a_half_built_environment_is_never_used_and_the_next_install_starts_over(
        empty_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env = ENVIRONMENTS["keras-hub"]
    half = home.managed_dir(env)
    (half / "keras_hub").mkdir(parents=True)  # a build cut short: files, no stamp
    stale = home.envs_home() / f".{half.name}.tmp-99999"
    stale.mkdir()
    assert find_managed(env) is None
    with pytest.raises(UsageError, match="ckpt-guard env install keras-hub"):
        find("keras-hub")
    offline(monkeypatch)
    assert main(["env", "install", "keras-hub"]) == 2
    err = capsys.readouterr().err
    assert f"removing {half.name} (half-built: no stamp)" in err and f"removing {stale.name}" in err
    assert error_line(err).startswith("ckpt-guard: error: env install keras-hub: installing failed: ")
    assert not half.exists() and not stale.exists() and not list(home.envs_home().iterdir())


def test_an_install_without_the_registry_names_its_error(empty_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    offline(monkeypatch)
    assert main(["env", "install", "tunix"]) == 2
    err = capsys.readouterr().err
    line = error_line(err)
    assert line.startswith("ckpt-guard: error: env install tunix: installing failed: ")
    assert "Looking in indexes: http://127.0.0.1:9/simple" in line and "google-tunix" in line, line
    assert ".txt" not in err, err  # no message names a file inside the package
    assert not home.envs_home().exists() or not list(home.envs_home().iterdir())  # nothing left behind


# ---- isolation: the worker's path


@pytest.mark.slow
def test_the_workers_path_holds_no_other_distribution(tmp_path: Path) -> None:
    from against_envs import ensure
    from test_parity_against import save_tiny

    python = ensure("keras-hub").python  # an overlay's Python: the worker's path is all PYTHONPATH holds
    record = tmp_path / "pythonpath.txt"
    # each entry of the path it was given, and what that folder holds, while it exists
    wrapper = script(tmp_path / "python", f'IFS=:; for d in $PYTHONPATH; do printf "%s=" "$d" >> "{record}"; '
                                          f'ls -A "$d" | tr "\\n" " " >> "{record}"; echo >> "{record}"; done; '
                                          f'unset IFS\nexec "{python}" "$@"\n')
    src = save_tiny(tmp_path / "m", "qwen3", "float32")
    out = tmp_path / "r.json"
    assert main(["parity", str(src), "--against", "keras-hub", "--against-python", str(wrapper), "-f", "json",
                 "-o", str(out)]) == 0
    assert json.loads(out.read_text())["extra"]["parity"]["environment"]["where"] == "named"
    entries = [line.split("=", 1) for line in record.read_text().splitlines()]
    assert len(entries) >= 2  # the probe's and the worker's
    for folder, held in entries:
        assert held.split() == ["guard"], (folder, held)  # no site-packages, no *.dist-info, no other package


@pytest.mark.slow
def test_a_version_outside_the_checked_set_is_recorded_in_the_json_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keras-hub's real environment, with a keras_hub 0.31.0 distribution's metadata ahead of it on the path (what
    importlib.metadata reads first): the check runs, warns on stderr naming both versions, and the report's
    environment figures hold the same warning."""
    from against_envs import ensure
    from test_parity_against import save_tiny

    managed = ensure("keras-hub").python
    shadow = tmp_path / "shadow" / "keras_hub-0.31.0.dist-info"
    shadow.mkdir(parents=True)
    (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: keras-hub\nVersion: 0.31.0\n")
    python = script(tmp_path / "python", f'PYTHONPATH="$PYTHONPATH:{shadow.parent}" exec "{managed}" "$@"\n')
    src = save_tiny(tmp_path / "m", "qwen3", "float32")
    out = tmp_path / "r.json"
    assert main(["parity", str(src), "--against", "keras-hub", "--against-python", str(python), "-f", "json",
                 "-o", str(out)]) == 0
    warning = (f"keras-hub: keras-hub 0.31.0 in --against-python {python}; checked with "
               f"{ENVIRONMENTS['keras-hub'].checked[0]}: its verdicts may differ")
    assert f"ckpt-guard: warning: {warning}" in capsys.readouterr().err
    environment = json.loads(out.read_text())["extra"]["parity"]["environment"]
    assert environment["where"] == "named" and environment["version"] == "0.31.0"
    assert environment["warning"] == warning


# ---- the silent pass


def _tiny_bert(folder: Path) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)).save_pretrained(folder)
    return folder


def _transformers_5_site() -> str:
    import transformers

    return str(Path(transformers.__file__).resolve().parent.parent)


@pytest.mark.slow
@pytest.mark.parametrize("checked", ["as built", "another"])
def test_convert_parity_runs_the_flax_side_on_transformers_4_where_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checked: str) -> None:
    """The Flax side runs in the named transformers-4 Python and the report says where.  With the row's checked
    set made another version (the registry patched), it still runs, and the report records the warning."""
    from against_envs import ensure

    tf4 = ensure("tf4").python
    if checked == "another":
        monkeypatch.setitem(ENVIRONMENTS, "tf4", ENVIRONMENTS["tf4"]._replace(checked=("4.57.5",)))
    src = _tiny_bert(tmp_path / "bert")
    report = tmp_path / "r.json"
    assert main(["convert", str(src), "--to", "flax", "--out", str(tmp_path / "f"), "--parity", "--flax-python",
                 str(tf4), "-f", "json", "-o", str(report)]) == 0
    parity = json.loads(report.read_text())["extra"]["parity"]
    assert parity["passed"] is True and parity["flax_side"]["transformers"] == "4.57.6"
    assert [c["name"] for c in parity["comparisons"] if c["judged"]]
    environment = parity["environment"]
    assert environment["where"] == "named" and environment["version"] == "4.57.6"
    if checked == "as built":
        assert "warning" not in parity["flax_side"] and "warning" not in environment
    else:
        warning = f"tf4: transformers 4.57.6 in --flax-python {tf4}; checked with 4.57.5: its verdicts may differ"
        assert environment["warning"] == warning


@pytest.mark.slow
@pytest.mark.parametrize("seen_by", ["probe and worker", "worker only"])
def test_a_named_environment_with_transformers_5_first_is_exit_2_and_no_output(
        tmp_path: Path, seen_by: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The named transformers-4 environment broken: transformers 5 on its path ahead of its own (what the
    worker's path once did from a wheel).  Seen by the probe: refused before anything is written.  Seen only
    by the worker (a wrapper that breaks only `-m guard.worker`): the worker says which transformers it
    imported, and convert removes the output it wrote."""
    from against_envs import ensure

    tf4 = ensure("tf4").python
    condition = "true" if seen_by == "probe and worker" else '[ "$2" = guard.worker ]'
    broken = script(tmp_path / "python", f'if {condition}; then PYTHONPATH="$PYTHONPATH:{_transformers_5_site()}"; '
                                         f'export PYTHONPATH; fi\nexec "{tf4}" "$@"\n')
    src = _tiny_bert(tmp_path / "bert")
    out = tmp_path / "f"
    code = main(["convert", str(src), "--to", "flax", "--out", str(out), "--parity", "--flax-python", str(broken)])
    line = error_line(capsys.readouterr().err)
    assert code == 2 and not out.exists()
    assert "transformers 5." in line and "CG303" not in line and "ckpt-guard env install tf4" in line


def test_a_failed_install_quotes_pips_error_without_a_path_inside_the_package() -> None:
    """pip names a constraint's source ("from -c FILE"): the one line names ckpt-guard's pins, never a file inside
    the package."""
    from guard.envs.build import _run
    from guard.envs.home import constraints_file

    path = constraints_file("tunix.txt")
    said = f"ERROR: No matching distribution found for jax==0.10.2 (from -c {path} (line 39))"
    with pytest.raises(UsageError) as raised:
        _run([sys.executable, "-c", f"import sys; print({said!r}, file=sys.stderr); sys.exit(1)"], "tunix")
    line = str(raised.value)
    assert "\n" not in line and "(from ckpt-guard's tunix pins (line 39))" in line, line
    assert str(path.parent) not in line and "tunix.txt" not in line


# ---- ready means it runs: the worker's imports and a tiny forward, before the stamp


def test_an_environment_that_does_not_import_names_the_module_and_the_command(tmp_path: Path) -> None:
    """The smoke check runs the environment's Python with the worker's path: a module the worker imports and the
    environment lacks is one line naming it and the pip command that installs it (torch: its CPU build)."""
    from guard.envs.build import CPU_TORCH, smoke

    env = ENVIRONMENTS["keras-hub"]._replace(imports=("json", "no_such_module_cg"), smoke="")
    with pytest.raises(UsageError) as raised:
        smoke(env, Path(sys.executable))
    line = str(raised.value)
    assert line == (f"env install keras-hub: the environment built does not run: no module named 'no_such_module_cg' "
                    f"(imported by the worker there): `{sys.executable} -m pip install no_such_module_cg`")
    with pytest.raises(UsageError, match=rf"no module named 'torch\.no_such_cg'.*pip install torch {CPU_TORCH}"):
        smoke(env._replace(imports=("torch.no_such_cg",)), Path(sys.executable))
    with pytest.raises(UsageError, match=r"'PIL_cg'.*pip install PIL_cg`$"):
        smoke(env._replace(imports=("PIL_cg",)), Path(sys.executable))
    broken = env._replace(imports=("json",), smoke="json:no_such_function")
    with pytest.raises(UsageError, match=r"does not run its check \(json:no_such_function\): .*AttributeError"):
        smoke(broken, Path(sys.executable))
    assert smoke(env._replace(imports=("json",)), Path(sys.executable)) == "imports"


def test_a_row_that_borrows_torch_is_refused_where_this_python_has_none(empty_home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An overlay takes this Python's torch (whichever build the user chose); without one, the install says how to
    get the CPU build, before anything is built."""
    from guard.envs import build

    monkeypatch.setattr(build, "_here", lambda name: name != "torch")
    with pytest.raises(UsageError) as raised:
        build.install(ENVIRONMENTS["tunix"], say=lambda line: None)
    assert str(raised.value) == (
        f"env install tunix: uses this Python's torch (whichever build you chose: a CPU check needs no CUDA wheels), "
        f"and {sys.executable} has none: install the CPU build first: `{sys.executable} -m pip install torch "
        "--index-url https://download.pytorch.org/whl/cpu`")
    assert not home.envs_home().exists() or not list(home.envs_home().iterdir())


def test_what_a_row_borrows_is_neither_required_nor_pinned(tmp_path: Path) -> None:
    from guard.envs.build import install_steps

    for name, env in ENVIRONMENTS.items():
        steps = install_steps(env, tmp_path / name)
        assert steps and all("torch" not in args for args in steps), name
        if env.borrows:
            assert env.kind == "overlay" and "torch" in env.imports, name
            pins = (tmp_path / name / env.constraints).read_text()
            assert not any(line.startswith("torch==") for line in pins.splitlines()), name
        assert any(m == env.module or m.startswith(env.module + ".") for m in env.imports), name


@pytest.mark.slow
def test_keras_hub_is_ready_when_it_says_so_and_names_what_it_lacks(tmp_path: Path) -> None:
    """keras-hub's environment runs its check (keras on JAX, keras_hub, sentencepiece, a tiny Qwen3 backbone's
    logits); the same check where sentencepiece cannot be imported names it and the command that installs it
    (what `env install keras-hub` said "ready" over before: keras-hub without keras or sentencepiece)."""
    from against_envs import ensure

    from guard.envs.build import smoke

    env = ENVIRONMENTS["keras-hub"]
    found = ensure("keras-hub")
    assert home.read_stamp(home.managed_dir(env))["checked"].startswith("keras 3.")
    said = smoke(env, found.python, found.path)
    assert said.startswith("keras 3.") and "(jax)" in said and "keras-hub 0.32.0" in said
    blocked = tmp_path / "blocked" / "sentencepiece"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'sentencepiece'\", "
                                         "name='sentencepiece')\n")
    with pytest.raises(UsageError) as raised:
        smoke(env, found.python, (blocked.parent, *found.path))
    assert str(raised.value).endswith(f"no module named 'sentencepiece' (imported by the worker there): "
                                      f"`{sys.executable} -m pip install sentencepiece`")


# ---- no GPU wheels for a CPU check: what `env install` would download, from the public index alone

# maxtext[tpu] 0.2.5 itself requires these two: CUDA's C++ headers (4.1 MB) and NVML's Python bindings (58 KB),
# neither a GPU runtime
MAXTEXT_OWN_NVIDIA = {"nvidia-cuda-cccl", "nvidia-ml-py"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_an_install_downloads_no_gpu_wheels(name: str, tmp_path: Path) -> None:
    """`pip install --dry-run --report` of exactly the steps `env install NAME` runs, with a pip configuration that
    has only the public index (no local wheel folder, no machine-wide constraints): no nvidia-* wheel, and no torch
    or triton (an overlay borrows this Python's torch; MaxText's venv needs none).  An overlay's pip sees this
    Python's packages, as the dry run of this Python's pip does; a venv of its own (MaxText's Python 3.12) is
    resolved from nothing.  Figures (a loaded 2-core machine): keras-hub 3 s, tunix 28 s, EasyDeL 105 s, MaxText
    173 s, most of it fetching metadata."""
    from guard.envs.build import install_steps

    env = ENVIRONMENTS[name]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    environment.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="https://pypi.org/simple", HOME=str(tmp_path))
    fresh = (["--ignore-installed", "--python-version", env.python, "--only-binary", ":all:"]
             if env.kind == "venv" else [])
    names: dict[str, str] = {}
    for i, args in enumerate(install_steps(env, tmp_path / "pins")):
        report = tmp_path / f"report-{i}.json"
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--disable-pip-version-check",
                               "--report", str(report), *fresh, *args], capture_output=True, text=True, timeout=1200,
                              env=environment)
        assert proc.returncode == 0, proc.stderr[-2000:]
        names.update({item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
                      for item in json.loads(report.read_text())["install"]})
    assert env.distribution in names or any(r.split("[")[0] in names for r in env.requirements), names
    gpu = {n for n in names if n.startswith("nvidia-")} - (MAXTEXT_OWN_NVIDIA if name == "maxtext" else set())
    assert not gpu, gpu
    assert not {"torch", "triton"} & set(names), names  # this Python's torch where the side needs one; else none
