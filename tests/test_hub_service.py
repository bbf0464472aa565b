"""The reviewer as a service: /metrics, /healthz, `--once`, JSON logs, failing jobs, a clean shutdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from hub_delivery import REPO_ROOT, AppServer, Push, answers, make_pushes, make_reviewer  # noqa: E402
from hub_standin import StandinHub, standin_fixture, tiny_safetensors  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.hub.queue import Job, open_queue  # noqa: E402


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def test_metrics_are_prometheus_text(standin: StandinHub, tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    pushes = make_pushes(standin, "org/m", 5)
    service = AppServer(make_reviewer(tmp_path / "q.sqlite3"))
    try:
        for push in pushes:
            assert service.post(push.event()).status_code == 202
        assert service.post(pushes[0].event()).json()["duplicates"] == 1
        assert service.post(pushes[0].event(), secret="nope").status_code == 403
        assert service.post(None, raw=b"[]").status_code == 400
        assert service.reviewer.wait_idle(30)
        response = service.http.get("/metrics")
    finally:
        service.stop()
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}

    def value(name: str, **labels: str) -> float:
        family = families[name]
        [sample] = [s for s in family.samples if s.labels == labels and s.name.endswith(("_total", name))]
        return sample.value

    assert value("ckpt_guard_deliveries_received", ) == 8
    assert value("ckpt_guard_deliveries_rejected", reason="wrong_secret") == 1
    assert value("ckpt_guard_deliveries_rejected", reason="bad_payload") == 1
    assert value("ckpt_guard_jobs_enqueued") == 5 and value("ckpt_guard_jobs_duplicate") == 1
    assert value("ckpt_guard_jobs_finished", outcome="answered") == 5
    assert value("ckpt_guard_jobs", state="answered") == 5 and value("ckpt_guard_jobs", state="queued") == 0
    assert value("ckpt_guard_hub_requests", status="2xx") >= 15
    assert value("ckpt_guard_queue_up") == 1 and value("ckpt_guard_workers_alive") == 4
    histogram = {s.name: s for s in families["ckpt_guard_scan_seconds"].samples if "le" not in s.labels}
    assert histogram["ckpt_guard_scan_seconds_count"].value == 5 and histogram["ckpt_guard_scan_seconds_sum"].value > 0


def test_an_unreachable_queue_is_503_on_healthz_and_webhook(standin: StandinHub, tmp_path: Path) -> None:
    [push] = make_pushes(standin, "org/m", 1)
    service = AppServer(make_reviewer(tmp_path / "q.sqlite3"))
    try:
        assert service.http.get("/healthz").json()["status"] == "ok"
        service.reviewer.queue.close()  # the database is gone from under the service
        health = service.http.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        assert "job queue" in health.json()["problems"][0]
        refused = service.post(push.event())
        assert refused.status_code == 503 and refused.headers["retry-after"] == "30"  # the Hub delivers again
        assert "ckpt_guard_queue_up 0" in service.http.get("/metrics").text
    finally:
        service.stop()


def test_a_failing_job_is_retried_then_failed_and_listed(standin: StandinHub, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    standin.add_repo("org/flaky", {"model.safetensors": tiny_safetensors("F32")})
    standin.fail("GET", "/api/models/org/flaky", 500, times=1000)
    state = tmp_path / "q.sqlite3"
    reviewer = make_reviewer(state, workers=1)
    reviewer.client.attempts = 1  # one request per job attempt: the queue does the retrying here
    reviewer.start()
    assert reviewer.submit(Job("org/flaky", "refs/heads/main", standin.repos["org/flaky"].refs["main"]))
    assert reviewer.wait_idle(30)
    reviewer.close()
    [failed] = reviewer.queue.jobs(["failed"])
    assert failed.attempts == reviewer.settings.max_attempts and "HTTP 500" in (failed.error or "")
    assert len(standin.matching(contains="/api/models/org/flaky")) == reviewer.settings.max_attempts
    assert main(["hub", "jobs", "--state", str(state), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["failed"] == 1


def test_a_clean_shutdown_hands_running_jobs_back(standin: StandinHub, tmp_path: Path) -> None:
    standin.add_repo("org/slow", {"model.safetensors": tiny_safetensors("F32")})
    standin.fail("GET", "/resolve/", None, times=1)  # the scan stalls until the stand-in stops
    reviewer = make_reviewer(tmp_path / "q.sqlite3", workers=1)
    reviewer.settings = reviewer.settings._replace(grace=0.3)
    reviewer.start()
    reviewer.submit(Job("org/slow", "refs/heads/main", standin.repos["org/slow"].refs["main"]))
    deadline = time.monotonic() + 10
    while reviewer.stats()["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # until a worker has claimed it
    started = time.monotonic()
    reviewer.close()
    assert time.monotonic() - started < 5
    [back] = reviewer.queue.jobs(["queued"])
    assert back.attempts == 0 and back.worker is None  # due at once for the next start, the attempt not counted


def run_cli(args: list[str], hub: StandinHub, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CKPT_GUARD_"))}
    env.update(PYTHONPATH=str(REPO_ROOT), HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"),
               HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1", XDG_CACHE_HOME=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "guard", "hub", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_once_drains_the_queue_with_json_logs(standin: StandinHub, tmp_path: Path) -> None:
    pushes = make_pushes(standin, "org/cron", 6)
    gone = Push("org/gone", "refs/heads/main", "f" * 40)
    state = str(tmp_path / "q.sqlite3")
    open_queue(state).enqueue([Job(p.repo, p.ref, p.sha) for p in [*pushes, gone]])
    done = run_cli(["webhook", "--once", "--state", state, "--token", "hf_bot", "--log-format", "json"],
                   standin, tmp_path)
    assert done.returncode == 2, done.stderr  # one job failed for good: the repository does not exist
    records = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    answered = [r for r in records if r.get("outcome") == "answered"]
    assert len(answered) == 6 and {"repo", "ref", "sha", "job", "scan_seconds", "latency_seconds"} <= set(answered[0])
    [summary] = [r for r in records if r.get("event") == "drained"]
    assert (summary["answered"], summary["failed"], summary["queued"]) == (6, 1, 0)
    assert answers(standin, pushes) == [1] * 6
    again = run_cli(["webhook", "--once", "--state", state, "--token", "hf_bot"], standin, tmp_path)
    assert again.returncode == 0 and "reviewed 0 job(s)" in again.stderr  # nothing due: nothing done twice


def test_accept_only_receiver_and_a_cron_reviewer(standin: StandinHub, tmp_path: Path) -> None:
    pushes = make_pushes(standin, "org/split", 3)
    state = tmp_path / "q.sqlite3"
    receiver = AppServer(make_reviewer(state, workers=0))
    try:
        assert all(receiver.post(p.event()).status_code == 202 for p in pushes)
        assert receiver.http.get("/healthz").json()["queued"] == 3  # healthy with no workers at all
    finally:
        receiver.stop()
    assert answers(standin, pushes) == [0, 0, 0]
    assert main(["hub", "webhook", "--once", "--state", str(state), "--token", "hf_bot"]) == 0
    assert answers(standin, pushes) == [1, 1, 1]


def test_a_misspelt_kill_point_is_refused(standin: StandinHub, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CKPT_GUARD_KILL_AT", "mid-scna:1")
    assert main(["hub", "webhook", "--once", "--state", str(tmp_path / "q.sqlite3")]) == 2
    assert "CKPT_GUARD_KILL_AT" in capsys.readouterr().err


def test_every_claim_has_its_own_holder(standin: StandinHub, tmp_path: Path) -> None:
    """Two threads of one process never share a claim: a lapsed lease is then seen by its old holder."""
    pushes = make_pushes(standin, "org/two", 4)
    reviewer = make_reviewer(tmp_path / "q.sqlite3", workers=2)
    reviewer.start()
    reviewer.submit_all([Job(p.repo, p.ref, p.sha) for p in pushes])
    assert reviewer.wait_idle(30)
    reviewer.close()
    holders = [j.worker for j in reviewer.queue.jobs(["answered"])]
    assert len(holders) == 4 and len(set(holders)) == 4
    assert len({h.rsplit("/", 1)[0] for h in holders if h}) == 1  # one process
