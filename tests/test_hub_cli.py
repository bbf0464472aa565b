"""The hub commands' edges: light imports, missing extras, usage errors, huggingface_hub 2.x."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from guard.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_hub_commands_keep_heavy_imports_out_of_the_core() -> None:
    code = (
        "import sys\n"
        "from guard.cli import main\n"
        "assert main(['hub', '--help']) == 0\n"
        "assert main(['hub', 'scan', '--help']) == 0\n"
        "heavy = [m for m in ('huggingface_hub', 'starlette', 'uvicorn', 'requests', 'httpx') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, capture_output=True)


@pytest.mark.parametrize("module, args", [
    ("huggingface_hub", ["hub", "scan", "org/x"]),
    ("starlette", ["hub", "webhook", "--secret", "s", "--port", "0"]),
])
def test_missing_extra_is_a_one_line_hint(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                          module: str, args: list[str]) -> None:
    if module == "starlette":
        pytest.importorskip("huggingface_hub")
    # None in sys.modules makes an import raise ImportError; submodules already imported
    # by other tests would otherwise still be found.
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")] + [module]:
        monkeypatch.setitem(sys.modules, name, None)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "pip install 'ckpt-guard[hub]'" in err and err.count("\n") == 1


def test_webhook_needs_a_secret(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CKPT_GUARD_WEBHOOK_SECRET", raising=False)
    assert main(["hub", "webhook"]) == 2
    assert "secret" in capsys.readouterr().err


# ---------------------------------------------------------------- huggingface_hub 2.x


@pytest.fixture(scope="module")
def hub2_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A throwaway venv with huggingface_hub 2.4.0 (httpx2) and this package (no deps)."""
    root = tmp_path_factory.mktemp("hub2") / "venv"
    venv.EnvBuilder(with_pip=True).create(root)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    install = subprocess.run([*pip, "huggingface_hub==2.4.0", "click>=8.1", "httpx"],
                             capture_output=True, text=True, timeout=600)
    if install.returncode != 0:
        pytest.skip(f"cannot install huggingface_hub 2.4.0 here: {install.stderr.strip()[-300:]}")
    subprocess.run([*pip, "--no-deps", str(REPO_ROOT)], check=True, capture_output=True, timeout=600)
    yield root


@pytest.mark.slow
def test_hub_scan_on_huggingface_hub_2(hub2_venv: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from hub_standin import LFS_POINTER_EXAMPLE, StandinHub, tiny_safetensors

    with StandinHub() as hub:
        hub.add_repo("org/ok", {"model.safetensors": tiny_safetensors("F32"), "config.json": b"{}"})
        hub.add_repo("org/mixed", {"model.safetensors": tiny_safetensors("F16"),
                                   "pointer/model.safetensors": LFS_POINTER_EXAMPLE})
        hub.add_repo("org/private", {"model.safetensors": tiny_safetensors("F32")}, private=True)
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "127.0.0.1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": "", "CI": "true"}
        cli = str(hub2_venv / "bin" / "ckpt-guard")

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([cli, "hub", "scan", *args], capture_output=True, text=True, env=env,
                                  cwd=tmp_path, timeout=120)

        version = subprocess.run([str(hub2_venv / "bin" / "python"), "-c",
                                  "import huggingface_hub; print(huggingface_hub.__version__)"],
                                 capture_output=True, text=True, env=env, check=True)
        assert version.stdout.strip() == "2.4.0"
        ok = run("org/ok")
        assert ok.returncode == 0, ok.stderr
        mixed = run("--author", "org", "--format", "json")
        assert mixed.returncode == 1, mixed.stderr
        report = json.loads(mixed.stdout)
        assert {"CG002", "CG101", "CG102"} <= {f["code"] for f in report["findings"]}
        assert sorted(r["repo"] for r in report["extra"]["hub"]["repos"]) == ["org/mixed", "org/ok"]
        private = run("org/private")
        assert private.returncode == 2 and "Traceback" not in private.stderr
        assert "org/private not found" in private.stderr
        missing_rev = run("org/ok", "--revision", "nope")
        assert missing_rev.returncode == 2 and "revision 'nope' not found" in missing_rev.stderr
        weight_gets = [r for r in hub.matching(method="GET", contains="/resolve/")
                       if r.path.endswith(".safetensors")]
        assert weight_gets and all(r.range for r in weight_gets)


@pytest.mark.slow
def test_reviewer_and_rate_limits_on_huggingface_hub_2(hub2_venv: Path, tmp_path: Path) -> None:
    """`hub webhook --once` and `hub scan --max-rps` on httpx2, while every third request gets a 429."""
    sys.path.insert(0, str(Path(__file__).parent))
    from hub_delivery import answers, make_pushes
    from hub_standin import StandinHub

    from guard.hub.queue import Job, open_queue

    with StandinHub() as hub:
        pushes = make_pushes(hub, "org/reviewed", 5)
        state = tmp_path / "q.sqlite3"
        queue = open_queue(state)
        queue.enqueue([Job(p.repo, p.ref, p.sha) for p in pushes])
        queue.close()
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "127.0.0.1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": "", "CI": "true"}
        cli = str(hub2_venv / "bin" / "ckpt-guard")
        hub.throttle(3, status=429, retry_after="1")
        done = subprocess.run([cli, "hub", "webhook", "--once", "--state", str(state), "--token", "hf_bot",
                               "--log-format", "json"], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        assert answers(hub, pushes) == [1] * 5
        hub.reset_records()
        audit = subprocess.run([cli, "hub", "scan", "--author", "org", "--max-rps", "20", "--format", "json"],
                               capture_output=True, text=True, env=env, timeout=120)
        assert audit.returncode == 1, audit.stderr  # the pushes mix dtypes: findings, but no error
        report = json.loads(audit.stdout)["extra"]["hub"]
        refused = sum(r.status == 429 for r in hub.records)
        assert refused and report["retried"] == {"429": refused}
        assert [r["error"] for r in report["repos"]] == [None]
