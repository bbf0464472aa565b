"""Rate limits: the stand-in Hub turns away every third request with 429 (or 503) and Retry-After.

An organisation audit of 50 repositories and a burst of 50 webhook deliveries
both finish with everything answered, every refused request is asked again
after the Retry-After, and the request rate seen by the stand-in stays within
``--max-rps``.  Uploads retry only what cannot have made a commit.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from hub_delivery import AppServer, answers, make_pushes, make_reviewer  # noqa: E402
from hub_standin import StandinHub, standin_fixture, tiny_safetensors  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.hub.retry import Backoff, RateLimiter, retry_after_seconds  # noqa: E402

MAX_RPS = 25.0


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def within_rate(hub: StandinHub, rate: float) -> tuple[int, float]:
    """The busiest two seconds' requests at the stand-in, and what ``rate`` allows there.

    The limiter hands out evenly spaced slots; requests reach the stand-in a
    little later, by however long their thread waited for the GIL and a core,
    so the allowance carries 300 ms worth of slots for that jitter (57.5 at
    25 per second).  Without the limit the audit puts about 100 requests in
    its busiest two seconds.
    """
    return hub.busiest_window(2.0), 2 * rate + 0.3 * rate


def retried_every_refusal(hub: StandinHub) -> bool:
    """Each request turned away was made again and then answered (same method, path and range)."""
    key = lambda r: (r.method, r.path, r.range)  # noqa: E731
    refused = Counter(key(r) for r in hub.records if r.status in (429, 503))
    answered = Counter(key(r) for r in hub.records if r.status < 400)
    return bool(refused) and all(answered[k] >= 1 for k in refused)


# ---------------------------------------------------------------- the policy, pure


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    now = 1_700_000_000.0
    assert retry_after_seconds({"Retry-After": "1"}) == 1.0
    assert retry_after_seconds({"retry-after": "120"}) == 120.0
    assert retry_after_seconds({"Retry-After": formatdate(now + 30, usegmt=True)}, now=now) == 30.0
    assert retry_after_seconds({"Retry-After": formatdate(now - 30, usegmt=True)}, now=now) == 0.0
    assert retry_after_seconds({"Retry-After": "10" * 10}) == 3600.0  # capped
    for useless in ({}, {"Retry-After": "soon"}, {"Retry-After": "-1"}, None):
        assert retry_after_seconds(useless, now=now) is None


def test_backoff_doubles_with_jitter_and_stops_at_the_deadline() -> None:
    policy = Backoff(attempts=5, base=1.0, cap=4.0, deadline=10.0)
    for attempt, step in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 4.0)):
        waits = [policy.wait(attempt) for _ in range(200)]
        assert step * 0.5 <= min(waits) and max(waits) <= step * 1.5 and len(set(waits)) > 1
    assert 2.0 <= policy.wait(1, retry_after=2.0) <= 2.2
    started = time.monotonic()
    assert policy.allows(1, 5.0, started=started) and not policy.allows(1, 11.0, started=started)
    assert not policy.allows(5, 0.0, started=started)


def test_a_failed_jobs_next_attempt_is_the_same_schedule_never_past_its_cap() -> None:
    """The reviewer's job retries wait by the client's Backoff: doubling from retry_backoff, jittered down."""
    from guard.hub.reviewer import JOB_RETRY_CAP

    policy = Backoff(base=30.0, cap=JOB_RETRY_CAP, jitter=(0.5, 1.0))
    for attempt, step in ((1, 30.0), (2, 60.0), (8, 3600.0), (20, 3600.0)):
        waits = [policy.wait(attempt) for _ in range(200)]
        assert step * 0.5 <= min(waits) and max(waits) <= step


def test_the_rate_limiter_is_shared_by_threads() -> None:
    limiter = RateLimiter(200)
    stamps: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(10):
            limiter.acquire()
            with lock:
                stamps.append(time.monotonic())

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stamps.sort()
    # 80 evenly spaced slots span 79 intervals, however the threads were scheduled.
    assert stamps[-1] - stamps[0] >= 79 / 200 * 0.99
    assert limiter.waited > 0


# ---------------------------------------------------------------- an organisation audit


@pytest.mark.slow
def test_org_audit_under_429s_and_max_rps(standin: StandinHub, tmp_path: Path) -> None:
    for i in range(50):
        standin.add_repo(f"acme/m{i:02d}", {"model.safetensors": tiny_safetensors("F32"), "config.json": b"{}"})
    standin.throttle(3, status=429, retry_after="1")
    rc = main(["hub", "scan", "--author", "acme", "--jobs", "16", "--max-rps", str(MAX_RPS),
               "--format", "json", "-o", str(tmp_path / "audit.json")])
    assert rc == 0
    report = json.loads((tmp_path / "audit.json").read_text())
    assert len(report["extra"]["hub"]["repos"]) == 50 and not report["findings"]
    refused = sum(r.status == 429 for r in standin.records)
    assert refused >= 40  # a third of ~150 requests
    assert report["extra"]["hub"]["retried"] == {"429": refused}
    assert retried_every_refusal(standin)
    busiest, allowed = within_rate(standin, MAX_RPS)
    assert busiest <= allowed, (busiest, allowed)


def test_503_with_retry_after_as_a_date_is_waited_for(standin: StandinHub, tmp_path: Path) -> None:
    standin.add_repo("acme/x", {"model.safetensors": tiny_safetensors("F32")})
    standin.throttle(2, status=503, retry_after=formatdate(time.time() + 1, usegmt=True))
    assert main(["hub", "scan", "acme/x", "-o", str(tmp_path / "r.txt")]) == 0
    assert retried_every_refusal(standin)


def test_a_rate_limit_past_the_deadline_is_one_line(standin: StandinHub,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    standin.add_repo("acme/x", {"model.safetensors": tiny_safetensors("F32")})
    standin.throttle(1, status=429, retry_after="30")  # every request, and a wait past the deadline
    started = time.monotonic()
    assert main(["hub", "scan", "acme/x", "--retry-deadline", "5"]) == 2
    assert time.monotonic() - started < 5  # not waited for: it would end past the deadline
    err = capsys.readouterr().err
    assert "HTTP 429" in err and "--max-rps" in err and err.count("\n") == 1
    assert len(standin.records) == 1


# ---------------------------------------------------------------- a burst of deliveries


@pytest.mark.slow
def test_burst_of_50_deliveries_under_429s_and_max_rps(standin: StandinHub, tmp_path: Path) -> None:
    pushes = make_pushes(standin, "org/burst", 50)
    service = AppServer(make_reviewer(tmp_path / "queue.sqlite3", workers=16, max_rps=MAX_RPS))
    try:
        standin.reset_records()
        standin.throttle(3, status=429, retry_after="1")
        with ThreadPoolExecutor(50) as pool:
            responses = list(pool.map(lambda p: service.post(p.event()), pushes))
        assert [r.status_code for r in responses] == [202] * 50
        assert service.reviewer.wait_idle(120)
        metrics = service.http.get("/metrics").text
    finally:
        service.stop()
    assert answers(standin, pushes) == [1] * 50
    assert service.reviewer.queue.__class__.__name__ == "SqliteQueue"
    refused = sum(r.status == 429 for r in standin.records)
    assert refused >= 50 and retried_every_refusal(standin)
    assert f'ckpt_guard_hub_requests_total{{status="429"}} {refused}' in metrics
    busiest, allowed = within_rate(standin, MAX_RPS)
    assert busiest <= allowed, (busiest, allowed)


# ---------------------------------------------------------------- uploads


def make_model(directory: Path) -> Path:
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(tiny_safetensors("F32"))
    (directory / "config.json").write_text("{}")
    return directory


@pytest.mark.parametrize("fault, commit_posts, commits", [
    (("POST", "/preupload/", 503, {}), 1, 1),  # before the commit request: nothing was made, asked again
    (("POST", "/commit/", 429, {"Retry-After": "0"}), 2, 1),  # refused by the rate limiter: asked again
    (("POST", "/commit/", 503, {"Retry-After": "0"}), 2, 1),  # a deliberate refusal: asked again
    (("POST", "/commit/", 503, {}), 1, 0),  # may have been made: not repeated, exit 2
], ids=["preupload-503", "commit-429", "commit-503-retry-after", "commit-503"])
def test_upload_retries_only_what_cannot_have_made_a_commit(standin: StandinHub, tmp_path: Path, fault: tuple,
                                                            commit_posts: int, commits: int) -> None:
    method, path, status, headers = fault
    standin.fail(method, path, status, headers=headers)
    rc = main(["hub", "upload", str(make_model(tmp_path / "m")), "org/new", "--token", "hf_bot"])
    assert len(standin.matching(method="POST", contains="/commit/")) == commit_posts
    assert len(standin.received_commits) == commits
    assert rc == (0 if commits else 2)
