"""`ckpt-guard hub webhook`: real payloads to a real uvicorn server; answers checked on the stand-in Hub."""

from __future__ import annotations

import socket
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

from hub_delivery import SECRET, AppServer as Service, make_reviewer  # noqa: E402
from hub_standin import StandinHub, standin_fixture  # noqa: E402

from guard.hub.comment import marker  # noqa: E402
from guard.hub.webhook import parse_payload  # noqa: E402


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


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


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


# ---------------------------------------------------------------- the secret and the size cap, on the wire


def raw_exchange(service: Service, head: bytes, body_parts: list[bytes], *, timeout: float = 5.0) -> bytes:
    """Send a request's head and some body bytes over a plain socket, then read what comes back.

    The body is never finished: a server that waited for all of it would time out here.
    """
    host, port = service.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head)
        for part in body_parts:
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered and closed: it stopped reading
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    return b"".join(chunks)


def request_head(*, secret: str | None = SECRET, length: int | None = None, chunked: bool = False) -> bytes:
    lines = ["POST /webhook HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if secret is not None:
        lines.append(f"X-Webhook-Secret: {secret}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_line(response: bytes) -> str:
    return response.split(b"\r\n", 1)[0].decode()


def test_a_declared_huge_body_is_413_before_a_byte_is_read(service: Service) -> None:
    from guard.hub.webhook import MAX_BODY

    response = raw_exchange(service, request_head(length=50 * MAX_BODY), [b"{" * 1024])
    assert status_line(response) == "HTTP/1.1 413 Request Entity Too Large"
    assert b"connection: close" in response.lower()


def test_a_streamed_body_over_the_cap_is_413_without_reading_the_rest(service: Service) -> None:
    from guard.hub.webhook import MAX_BODY

    chunk = b"x" * 65536
    parts = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (MAX_BODY // len(chunk) + 2)  # never the last chunk
    response = raw_exchange(service, request_head(chunked=True), parts)
    assert status_line(response) == "HTTP/1.1 413 Request Entity Too Large"
    # The service is still serving.
    assert service.http.get("/healthz").status_code == 200


@pytest.mark.parametrize("secret, expected", [(None, "401"), ("wrong", "403")])
def test_the_secret_is_checked_before_the_body_is_read(service: Service, secret: str | None,
                                                       expected: str) -> None:
    # A huge declared body that never comes: only a check made on the headers can answer.
    response = raw_exchange(service, request_head(secret=secret, length=10**9), [b"not json at all"])
    assert status_line(response).split()[1] == expected
    assert b"connection: close" in response.lower()


def test_the_secret_is_compared_in_constant_time(service: Service, monkeypatch: pytest.MonkeyPatch,
                                                 repo: str) -> None:
    import hmac

    import guard.hub.webhook

    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(guard.hub.webhook.hmac, "compare_digest", spy)
    assert service.post(None, raw=b"{broken", secret="s3cret-valuX").status_code == 403  # before parsing
    assert service.post(None, raw=b"{broken").status_code == 400
    assert compared == [(b"s3cret-valuX", SECRET.encode()), (SECRET.encode(), SECRET.encode())]


@pytest.mark.parametrize("refs", [7, "refs/heads/main", {"ref": "refs/heads/main"}])
def test_updated_refs_that_are_not_a_list_are_a_bad_payload(refs: object) -> None:
    event = payload("org/m", "refs/heads/main", "a" * 40)
    event["updatedRefs"] = refs
    with pytest.raises(ValueError, match="updatedRefs is not a list"):
        parse_payload(event)
