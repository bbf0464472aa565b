"""The reviewer's job queue, on SQLite files and on a real PostgreSQL server: the same promises."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hub_postgres import postgres_server, postgres_url  # noqa: F401 - fixtures

from guard.cli import main
from guard.hub.queue import Job, QueueError, default_state, open_queue

A, B, C = (Job("org/a", "refs/pr/1", "a" * 40), Job("org/b", "refs/heads/main", "b" * 40),
           Job("org/c", "refs/pr/2", "c" * 40))


@pytest.fixture(params=["sqlite", "postgres"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "queue.sqlite3")
    return str(request.getfixturevalue("postgres_url"))


def test_enqueue_claim_finish(state: str) -> None:
    queue = open_queue(state)
    assert queue.enqueue([A, B, A]) == [True, True, False]
    first = queue.claim("w1", lease=60, max_attempts=3)
    assert first is not None and first.job == A and first.state == "running" and first.attempts == 1
    second = queue.claim("w2", lease=60, max_attempts=3)
    assert second is not None and second.job == B
    assert queue.claim("w3", lease=60, max_attempts=3) is None
    assert queue.finish(first.id, "w1", "answered")
    assert not queue.finish(second.id, "w1", "answered")  # not w1's
    assert queue.finish(second.id, "w2", "skipped")
    assert queue.enqueue([A, B]) == [False, False]  # done: a redelivery is a duplicate
    assert queue.counts() == {"queued": 0, "running": 0, "answered": 1, "skipped": 1, "failed": 0}
    queue.close()
    reopened = open_queue(state)  # durable
    assert [(j.job, j.state, j.worker) for j in reopened.jobs()] == [(A, "answered", "w1"), (B, "skipped", "w2")]
    reopened.close()


def test_an_expired_lease_is_claimed_again_and_the_stale_worker_is_ignored(state: str) -> None:
    queue = open_queue(state)
    queue.enqueue([A])
    held = queue.claim("dead", lease=0.05, max_attempts=3)
    assert held is not None
    assert queue.claim("other", lease=60, max_attempts=3) is None  # still leased
    time.sleep(0.1)  # what is tested is a lease running out in real time
    again = queue.claim("other", lease=60, max_attempts=3)
    assert again is not None and again.id == held.id and again.attempts == 2
    assert queue.extend([(held.id, "dead")], lease=60) == set()
    assert not queue.finish(held.id, "dead", "answered")
    assert queue.extend([(held.id, "other")], lease=60) == {held.id}
    assert queue.finish(again.id, "other", "answered")


def test_a_job_whose_workers_keep_dying_fails(state: str) -> None:
    queue = open_queue(state)
    queue.enqueue([A])
    for _ in range(2):
        assert queue.claim("w", lease=0.01, max_attempts=2) is not None
        time.sleep(0.03)
    assert queue.claim("w", lease=60, max_attempts=2) is None
    [failed] = queue.jobs(["failed"])
    assert failed.attempts == 2 and "lease expired" in (failed.error or "")


def test_retry_fail_requeue_release(state: str) -> None:
    queue = open_queue(state)
    queue.enqueue([A, B])
    a = queue.claim("w", lease=60, max_attempts=5)
    b = queue.claim("w", lease=60, max_attempts=5)
    assert a and b
    assert queue.retry(a.id, "w", error="HTTP 503", delay=3600)
    assert queue.claim("w", lease=60, max_attempts=5) is None  # not due yet
    assert queue.fail(b.id, "w", error="repository gone")
    assert [(j.job, j.error) for j in queue.jobs(["queued", "failed"])] == [(A, "HTTP 503"), (B, "repository gone")]
    assert queue.enqueue([B]) == [True]  # a redelivery revives a failed job
    revived = queue.claim("w", lease=60, max_attempts=5)
    assert revived and revived.job == B and revived.attempts == 1
    assert queue.release([(revived.id, "elsewhere")]) == 0
    assert queue.release([(revived.id, "w")]) == 1  # a clean shutdown hands it back, the attempt not counted
    [back] = [j for j in queue.jobs(["queued"]) if j.job == B]
    assert back.attempts == 0 and back.worker is None
    again = queue.claim("w", lease=60, max_attempts=5)
    assert again and again.job == B
    assert queue.fail(again.id, "w", error="x") and queue.requeue_failed() == 1
    assert queue.counts()["queued"] == 2


def test_prune_forgets_only_old_finished_jobs(state: str) -> None:
    queue = open_queue(state)
    queue.enqueue([A, B])
    item = queue.claim("w", lease=60, max_attempts=5)
    assert item and queue.finish(item.id, "w", "answered")
    assert queue.prune(3600) == 0
    time.sleep(0.02)
    assert queue.prune(0.01) == 1
    assert [j.job for j in queue.jobs()] == [B]


def test_concurrent_claimers_never_share_a_job(state: str) -> None:
    jobs = [Job(f"org/m{i}", "refs/heads/main", f"{i:040x}") for i in range(120)]
    open_queue(state).enqueue(jobs)
    claimed: Counter[int] = Counter()
    lock = threading.Lock()

    def claimer(name: str) -> None:
        queue = open_queue(state)  # a connection of its own, as another process would have
        while (item := queue.claim(name, lease=60, max_attempts=5)) is not None:
            with lock:
                claimed[item.id] += 1
            assert queue.finish(item.id, name, "answered")
        queue.close()

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(claimed) == 120 and set(claimed.values()) == {1}
    assert open_queue(state).counts()["answered"] == 120


def test_hub_jobs_lists_and_requeues(state: str, capsys: pytest.CaptureFixture[str]) -> None:
    queue = open_queue(state)
    queue.enqueue([A, B, C])
    item = queue.claim("w", lease=60, max_attempts=5)
    assert item and queue.fail(item.id, "w", error="repository org/a not found")
    assert main(["hub", "jobs", "--state", state]) == 0
    out = capsys.readouterr().out
    assert "1 failed" in out and "2 queued" in out and "repository org/a not found" in out
    assert main(["hub", "jobs", "--state", state, "--requeue-failed", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert "1 failed job(s) queued again" in captured.err
    import json

    listing = json.loads(captured.out)
    assert listing["counts"]["queued"] == 3 and len(listing["jobs"]) == 3


def test_unusable_states_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             postgres_server) -> None:  # noqa: F811
    garbage = tmp_path / "not-a-db"
    garbage.write_bytes(b"this is not a database file at all" * 100)
    with pytest.raises(QueueError, match="not-a-db: cannot open the job queue"):
        open_queue(garbage)
    with pytest.raises(QueueError, match="not a supported database"):
        open_queue("mysql://db/x")
    nowhere = f"postgresql://bot:hunter2@/db?host={tmp_path}&connect_timeout=2"  # no server listens there
    with pytest.raises(QueueError, match="cannot reach the job queue") as raised:
        open_queue(nowhere)
    assert "hunter2" not in str(raised.value)
    assert main(["hub", "jobs", "--state", str(garbage)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_default_state_is_in_the_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_state() == tmp_path / "cache" / "ckpt-guard" / "reviewer.sqlite3"
    queue = open_queue(None)
    assert queue.where == str(default_state()) and default_state().is_file()
    queue.close()
