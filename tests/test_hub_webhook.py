"""`ckpt-guard hub webhook`: real payloads to a real uvicorn server; answers checked on the stand-in Hub."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from hub_standin import StandinHub, standin_fixture  # noqa: E402

from guard.config import build_policy  # noqa: E402
from guard.hub.client import HubClient  # noqa: E402
from guard.hub.comment import marker  # noqa: E402
from guard.hub.queue import open_queue  # noqa: E402
from guard.hub.reviewer import Reviewer, ReviewSettings  # noqa: E402
from guard.hub.webhook import create_app, parse_payload  # noqa: E402

SECRET = "s3cret-value"


def weights(dtype: Any) -> bytes:
    return safetensors_numpy.save({"w": np.zeros((4, 4), np.float32), "b": np.zeros((4,), dtype)})


def payload(repo: str, ref: str, sha: str | None, *, scope: str = "repo.content",
            repo_type: str = "model") -> dict[str, Any]:
    return {
        "event": {"action": "update", "scope": scope},
        "repo": {"type": repo_type, "name": repo, "id": "abc", "private": False,
                 "url": {"web": f"https://hub/{repo}", "api": f"https://hub/api/models/{repo}"},
                 "headSha": sha, "owner": {"id": "o1"}},
        "updatedRefs": [{"ref": ref, "oldSha": "0" * 40, "newSha": sha}],
        "webhook": {"id": "w1", "version": 3},
    }


class Service:
    """The webhook app on a real uvicorn server, on a random loopback port."""

    def __init__(self, reviewer: Reviewer) -> None:
        self.reviewer = reviewer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(secret=SECRET, reviewer=reviewer), log_level="warning",
                                limit_concurrency=200, backlog=256)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        self.http = httpx.Client(base_url=self.url, timeout=10, trust_env=False)
        for _ in range(200):  # bounded wait for startup, no sleep: started is set by uvicorn
            if self.server.started:
                break
            self.thread.join(0.02)
        assert self.server.started

    def post(self, body: Any, *, secret: str | bytes | None = SECRET, raw: bytes | None = None) -> httpx.Response:
        headers: dict[str, str | bytes] = {"Content-Type": "application/json"}
        if secret is not None:
            headers["X-Webhook-Secret"] = secret
        return self.http.post("/webhook", content=raw if raw is not None else json.dumps(body), headers=headers)

    def stop(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def make_reviewer(state: Path, workers: int = 4) -> Reviewer:
    """A reviewer on its own SQLite queue, with test-sized leases and back-offs."""
    settings = ReviewSettings(workers=workers, lease=5.0, retry_backoff=0.0, poll=0.05)
    return Reviewer(HubClient(token="hf_bot", timeout=10), build_policy({}, source=None, overrides={}),
                    open_queue(state), settings=settings)


@pytest.fixture
def service(standin: StandinHub, tmp_path: Path) -> Iterator[Service]:
    svc = Service(make_reviewer(tmp_path / "queue.sqlite3"))  # the app's lifespan starts the workers
    yield svc
    svc.stop()


@pytest.fixture
def repo(standin: StandinHub) -> str:
    standin.add_repo("org/model", {"model.safetensors": weights(np.float32)})
    return "org/model"


def test_secret_is_required(service: Service, standin: StandinHub, repo: str) -> None:
    sha = standin.repos[repo].refs["main"]
    assert service.post(payload(repo, "refs/heads/main", sha), secret=None).status_code == 401
    assert service.post(payload(repo, "refs/heads/main", sha), secret="wrong").status_code == 403
    assert service.post(payload(repo, "refs/heads/main", sha), secret="ünïcode".encode()).status_code == 403
    assert service.reviewer.wait_idle(10)
    assert standin.repos[repo].discussions == []


def test_bad_bodies_are_400_and_the_service_keeps_running(service: Service) -> None:
    assert service.post(None, raw=b"not json{").status_code == 400
    assert service.post(None, raw=b"\xff\xfe").status_code == 400
    assert service.post([1, 2]).status_code == 400
    assert service.post({"event": {"scope": "repo.content"}, "repo": "x"}).status_code == 400
    health = service.http.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize("scope, repo_type, ref", [
    ("discussion.comment", "model", "refs/heads/main"),
    ("repo.config", "model", "refs/heads/main"),
    ("brand.new.scope", "model", "refs/heads/main"),
    ("repo.content", "dataset", "refs/heads/main"),
    ("repo.content", "model", "refs/tags/v1"),
])
def test_unwatched_events_are_ignored(service: Service, standin: StandinHub, repo: str, scope: str,
                                      repo_type: str, ref: str) -> None:
    sha = standin.repos[repo].refs["main"]
    response = service.post(payload(repo, ref, sha, scope=scope, repo_type=repo_type))
    assert response.status_code == 200 and response.json()["status"] == "ignored"
    assert standin.repos[repo].discussions == []


def test_push_to_main_opens_one_discussion_even_on_redelivery(service: Service, standin: StandinHub,
                                                             tmp_path: Path) -> None:
    sha = standin.add_repo("org/mixed", {"model.safetensors": weights(np.float16)})
    event = payload("org/mixed", "refs/heads/main", sha)
    response = service.post(event)
    assert response.status_code == 202 and response.json()["queued"] == 1
    assert service.reviewer.wait_idle(30)
    [discussion] = standin.repos["org/mixed"].discussions
    assert sha[:12] in discussion.title and not discussion.is_pr
    assert "CG102" in discussion.description and marker(sha) in discussion.description
    assert discussion.author == "ckpt-guard-bot"
    # Redelivered (the Hub retries; the Activity tab replays): no second answer.
    assert service.post(event).json()["duplicates"] == 1
    # Even from a service that lost its queue: the Hub is asked first.
    fresh = make_reviewer(tmp_path / "fresh.sqlite3")
    fresh.start()
    for job in parse_payload(event)[0] or []:
        assert fresh.submit(job)
    assert fresh.wait_idle(30)
    fresh.close()
    assert len(standin.repos["org/mixed"].discussions) == 1
    assert fresh.stats()["skipped"] == 1


def test_push_to_a_pr_ref_comments_on_the_pr(service: Service, standin: StandinHub, repo: str,
                                             tmp_path: Path) -> None:
    num, sha = standin.add_pull_request(repo, {"model.safetensors": weights(np.float16)})
    assert service.post(payload(repo, f"refs/pr/{num}", sha)).status_code == 202
    assert service.reviewer.wait_idle(30)
    [pr] = standin.repos[repo].discussions
    [(author, comment)] = pr.comments
    assert author == "ckpt-guard-bot" and "CG102" in comment and f"pull request #{num}" in comment
    # Redelivery to a service that lost its queue: the marker in the existing comment prevents a second one.
    fresh = make_reviewer(tmp_path / "fresh.sqlite3")
    fresh.start()
    assert fresh.submit(parse_payload(payload(repo, f"refs/pr/{num}", sha))[0][0])  # type: ignore[index]
    assert fresh.wait_idle(30)
    fresh.close()
    assert len(pr.comments) == 1


def test_deleted_ref_is_ignored(service: Service, repo: str) -> None:
    response = service.post(payload(repo, "refs/heads/old", None))
    assert response.json()["status"] == "ignored"


def test_a_failed_scan_is_counted_and_can_be_retried(service: Service, standin: StandinHub) -> None:
    response = service.post(payload("org/does-not-exist", "refs/heads/main", "a" * 40))
    assert response.status_code == 202
    assert service.reviewer.wait_idle(30)
    assert service.http.get("/healthz").json()["failed"] == 1
    assert service.post(payload("org/does-not-exist", "refs/heads/main", "a" * 40)).json()["queued"] == 1
    assert service.reviewer.wait_idle(30)


def test_fifty_deliveries_at_once(service: Service, standin: StandinHub, repo: str) -> None:
    prs = [standin.add_pull_request(repo, {"model.safetensors": weights(np.float32)}, title=f"pr {i}")
           for i in range(50)]
    events = [payload(repo, f"refs/pr/{num}", sha) for num, sha in prs]
    with ThreadPoolExecutor(50) as pool:
        responses = list(pool.map(service.post, events))
    assert [r.status_code for r in responses] == [202] * 50
    assert service.reviewer.wait_idle(120)
    discussions = standin.repos[repo].discussions
    assert [len(d.comments) for d in discussions] == [1] * 50
    assert service.reviewer.stats() == {"queued": 0, "running": 0, "answered": 50, "skipped": 0, "failed": 0}
