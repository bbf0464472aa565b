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

from guard.hub.comment import branch_thread_title, marker  # noqa: E402
from guard.hub.webhook import parse_payload  # noqa: E402


def weights(dtype: Any) -> bytes:
    return safetensors_numpy.save({"w": np.zeros((4, 4), np.float32), "b": np.zeros((4,), dtype)})


def payload(repo: str, ref: str, sha: str | None, *, scope: str = "repo.content",
            repo_type: str = "model", old: str | None = "0" * 40) -> dict[str, Any]:
    return {
        "event": {"action": "update", "scope": scope},
        "repo": {"type": repo_type, "name": repo, "id": "abc", "private": False,
                 "url": {"web": f"https://hub/{repo}", "api": f"https://hub/api/models/{repo}"},
                 "headSha": sha, "owner": {"id": "o1"}},
        "updatedRefs": [{"ref": ref, "oldSha": old, "newSha": sha}],
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
    assert discussion.title == branch_thread_title("refs/heads/main") and not discussion.is_pr
    assert sha[:12] in discussion.description
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


# ---------------------------------------------------------------- the push's change (oldSha), not the snapshot


def model_weights(*, w: Any = np.float32, bias: bool = True, head: bool = False) -> bytes:
    """A 16 MiB checkpoint written by safetensors: the reviewer's 64 KiB header read is far below 1 % of it."""
    tensors = {"w": np.zeros((2048, 2048), w)}
    if bias:
        tensors["b"] = np.zeros((2048,), np.float32)
    if head:
        tensors["lm_head.weight"] = np.zeros((16, 2048), np.float32)
    return safetensors_numpy.save(tensors)


def quiet_pushes(service: Service) -> float:
    for line in service.http.get("/metrics").text.splitlines():
        if line.startswith("ckpt_guard_pushes_quiet_total "):
            return float(line.split()[1])
    raise AssertionError("ckpt_guard_pushes_quiet_total is not exported")


def weight_bytes_read(standin: StandinHub) -> int:
    return sum(r.bytes for r in standin.matching(method="GET", contains="/resolve/")
               if r.path.endswith(".safetensors"))


def machine_summary(text: str) -> dict[str, Any]:
    import json

    return json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])


def deliver(service: Service, event: dict[str, Any]) -> None:
    assert service.post(event).status_code == 202
    assert service.reviewer.wait_idle(60)


def test_branch_pushes_are_answered_as_changes_in_one_thread(service: Service, standin: StandinHub,
                                                             tmp_path: Path) -> None:
    repo = "org/evolving"
    first = standin.add_repo(repo, {"model.safetensors": model_weights(), "config.json": b'{"torch_dtype": "float32"}'})
    size = len(model_weights())

    # README only: reviewed (both listings), nothing posted, counted
    readme = standin.add_commit(repo, {"README.md": b"# hello\n"}, replace=False)
    standin.reset_records()
    deliver(service, payload(repo, "refs/heads/main", readme, old=first))
    assert standin.repos[repo].discussions == [] and quiet_pushes(service) == 1
    assert weight_bytes_read(standin) == 0  # the listings said it: no header was read
    assert service.reviewer.stats()["skipped"] == 1

    # first weight push: a re-save that recast w to fp16 -> one discussion for the branch, the diff in it
    recast = standin.add_commit(repo, {"model.safetensors": model_weights(w=np.float16)}, replace=False)
    standin.reset_records()
    deliver(service, payload(repo, "refs/heads/main", recast, old=readme))
    [thread] = standin.repos[repo].discussions
    assert thread.title == branch_thread_title("refs/heads/main") and not thread.is_pr
    assert marker(recast) in thread.description and readme[:12] in thread.description
    assert "recast" in thread.description and "CG101" in machine_summary(thread.description)["introduced"]
    assert weight_bytes_read(standin) < 0.01 * (size + len(model_weights(w=np.float16)))  # header-only

    # second weight push: the bias dropped, a head added, w back to fp32 -> a comment in the same thread
    reshaped = standin.add_commit(repo, {"model.safetensors": model_weights(bias=False, head=True)}, replace=False)
    event = payload(repo, "refs/heads/main", reshaped, old=recast)
    standin.reset_records()
    deliver(service, event)
    assert len(standin.repos[repo].discussions) == 1
    [(author, comment)] = thread.comments
    assert author == "ckpt-guard-bot" and marker(reshaped) in comment and recast[:12] in comment
    assert "**added** lm\\_head.weight" in comment and "**removed** b F32" in comment  # names, escaped
    assert "**recast** F16" in comment and "Resolved (3)" in comment
    summary = machine_summary(comment)
    assert summary["base"] == recast and summary["introduced"] == [] and "CG101" in summary["resolved"]
    assert weight_bytes_read(standin) < 0.01 * 2 * size

    # a redelivery: a duplicate in the queue; a reviewer that lost its queue (a restart) finds the marker
    assert service.post(event).json()["duplicates"] == 1
    fresh = make_reviewer(tmp_path / "fresh.sqlite3")
    fresh.start()
    assert fresh.submit(parse_payload(event)[0][0])  # type: ignore[index]
    assert fresh.wait_idle(30)
    fresh.close()
    assert fresh.stats()["skipped"] == 1
    assert len(standin.repos[repo].discussions) == 1 and len(thread.comments) == 1


def test_pushes_to_a_pull_request_comment_the_diff_against_its_previous_head(service: Service,
                                                                            standin: StandinHub) -> None:
    repo = "org/reviewed"
    standin.add_repo(repo, {"model.safetensors": model_weights()})
    num, opened = standin.add_pull_request(repo, {"model.safetensors": model_weights(head=True)})
    deliver(service, payload(repo, f"refs/pr/{num}", opened, old=None))  # a new PR ref: no previous head
    [pr] = standin.repos[repo].discussions
    assert len(pr.comments) == 1 and marker(opened) in pr.comments[0][1]
    # a second push to the PR: recast; answered with the diff against the PR's previous head
    pushed = standin.add_commit(repo, {"model.safetensors": model_weights(w=np.float16, head=True)},
                                ref=f"refs/pr/{num}", replace=False)
    standin.reset_records()
    deliver(service, payload(repo, f"refs/pr/{num}", pushed, old=opened))
    assert len(pr.comments) == 2 and len(standin.repos[repo].discussions) == 1
    comment = pr.comments[1][1]
    assert marker(pushed) in comment and opened[:12] in comment and f"pull request #{num}" in comment
    assert "recast" in comment and "CG101" in machine_summary(comment)["introduced"]
    assert weight_bytes_read(standin) < 0.01 * 2 * len(model_weights(head=True))
    # a README push to the PR: quiet
    readme = standin.add_commit(repo, {"README.md": b"notes"}, ref=f"refs/pr/{num}", replace=False)
    deliver(service, payload(repo, f"refs/pr/{num}", readme, old=pushed))
    assert len(pr.comments) == 2 and quiet_pushes(service) == 1


def test_a_closed_thread_is_left_alone_and_a_vanished_previous_head_reviews_the_snapshot(
        service: Service, standin: StandinHub) -> None:
    repo = "org/forced"
    first = standin.add_repo(repo, {"model.safetensors": model_weights()})
    second = standin.add_commit(repo, {"model.safetensors": model_weights(w=np.float16)}, replace=False)
    deliver(service, payload(repo, "refs/heads/main", second, old=first))
    [thread] = standin.repos[repo].discussions
    from huggingface_hub import HfApi

    standin.tokens["hf_maintainer"] = "alice"
    HfApi(token="hf_maintainer").change_discussion_status(repo, thread.num, "closed")  # a maintainer closes it
    assert thread.status == "closed"
    third = standin.add_commit(repo, {"model.safetensors": model_weights(head=True)}, replace=False)
    deliver(service, payload(repo, "refs/heads/main", third, old="f" * 40))  # force-pushed away
    assert thread.comments == []
    [_, new_thread] = standin.repos[repo].discussions
    assert new_thread.title == thread.title and marker(third) in new_thread.description
    assert "cannot be read any more" in new_thread.description


@pytest.mark.parametrize("old, expected", [(None, None), ("0" * 40, None), ("xyz", None), (7, None),
                                           ("a" * 40, "a" * 40)])
def test_the_previous_head_is_read_from_old_sha(old: object, expected: str | None) -> None:
    event = payload("org/m", "refs/heads/main", "b" * 40)
    event["updatedRefs"][0]["oldSha"] = old
    [job] = parse_payload(event)[0] or []
    assert job.old_sha == expected


def test_checkpoint_files_are_the_hooks_and_the_actions_selection() -> None:
    """One selection of "a checkpoint changed": the reviewer's, the pre-commit hook's and the action's."""
    import re

    import yaml

    from guard.hub.changes import CHECKPOINT_FILES

    root = Path(__file__).resolve().parents[1]
    hooks = yaml.safe_load((root / ".pre-commit-hooks.yaml").read_text())
    assert {hook["files"] for hook in hooks if "files" in hook} == {"(?i)" + CHECKPOINT_FILES.pattern}
    select = (root / "scripts" / "action" / "select.sh").read_text()
    assert re.search(r'pattern = re\.compile\(r"(.*)", re\.I\)', select)[1] == CHECKPOINT_FILES.pattern  # type: ignore[index]
    for name in ("model.safetensors", "sub/config.json", "model.safetensors.index.json", "unet/x.bin",
                 "ckpt/_METADATA", "openvino_model.xml", "step-1/__0_0.distcp"):
        assert CHECKPOINT_FILES.search(name), name
    for name in ("README.md", "tokenizer.json", "generation_config.json", ".gitattributes", "LICENSE"):
        assert not CHECKPOINT_FILES.search(name), name


def test_the_queue_keeps_old_sha_and_migrates_a_queue_without_it(tmp_path: Path) -> None:
    """old_sha travels with the job, outside its key; a queue written before it (schema 2) gains it."""
    import sqlite3

    from guard.hub.queue import Job, open_queue

    state = tmp_path / "v2.sqlite3"
    with sqlite3.connect(state) as db:
        db.execute("""CREATE TABLE jobs (id INTEGER PRIMARY KEY, endpoint TEXT NOT NULL DEFAULT '',
            repo TEXT NOT NULL, ref TEXT NOT NULL, sha TEXT NOT NULL, state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0, enqueued_at REAL NOT NULL, updated_at REAL NOT NULL,
            next_at REAL NOT NULL, lease_until REAL, worker TEXT, error TEXT, UNIQUE (endpoint, repo, ref, sha))""")
        db.execute("INSERT INTO jobs (repo, ref, sha, state, enqueued_at, updated_at, next_at) "
                   "VALUES ('org/a', 'refs/heads/main', ?, 'queued', 1, 1, 1)", ("a" * 40,))
        db.execute("PRAGMA user_version = 2")
    queue = open_queue(state)
    [old] = queue.jobs()
    assert old.job.old_sha is None  # reviewed as a snapshot
    pushed = Job("org/b", "refs/heads/main", "b" * 40, old_sha="c" * 40)
    assert queue.enqueue([pushed]) == [True]
    assert queue.enqueue([Job("org/b", "refs/heads/main", "b" * 40, old_sha="d" * 40)]) == [False]  # same key
    first = queue.claim("w1", lease=60, max_attempts=3)
    second = queue.claim("w2", lease=60, max_attempts=3)
    assert first is not None and second is not None
    assert (first.job.old_sha, second.job.old_sha) == (None, "c" * 40)
    assert second.to_json()["old_sha"] == "c" * 40
    queue.close()
