"""Deliveries as the Hub sends them, to a real webhook service; answers counted on the stand-in.

``AppServer`` serves the app on a real uvicorn server in this process (a
reviewer with test-sized leases from ``make_reviewer``).  ``ServiceProcess`` runs the real command on a loopback
port (``--log-format json``, its log kept in a file).  ``Sender`` posts each delivery until a 2xx
comes back, trying the endpoints in turn, as the Hub redelivers what was not
acknowledged.  ``kill_scenario`` is the kill test: pushes delivered while one
replica stops itself with SIGKILL at a named point (``guard.hub.faults``), a
replacement started on the same port, and every push's answers counted.
Shared by ``tests/test_hub_kill.py`` and ``bench/hub.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from hub_standin import StandinHub, tiny_safetensors

from guard.config import build_policy
from guard.hub.client import HubClient
from guard.hub.comment import branch_thread_title, marker
from guard.hub.queue import open_queue
from guard.hub.retry import RateLimiter
from guard.hub.reviewer import Reviewer, ReviewSettings
from guard.hub.webhook import create_app

REPO_ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cret-value"


@dataclass(frozen=True)
class Push:
    repo: str
    ref: str
    sha: str

    def event(self) -> dict[str, Any]:
        return {"event": {"action": "update", "scope": "repo.content"},
                "repo": {"type": "model", "name": self.repo, "id": "r1", "private": False, "headSha": self.sha,
                         "url": {"web": f"https://hub/{self.repo}", "api": f"https://hub/api/models/{self.repo}"},
                         "owner": {"id": "o1"}},
                "updatedRefs": [{"ref": self.ref, "oldSha": "0" * 40, "newSha": self.sha}],
                "webhook": {"id": "w1", "version": 3}}


def make_reviewer(state: Path, workers: int = 4, *, max_rps: float | None = None) -> Reviewer:
    """A reviewer on its own SQLite queue, with test-sized leases and back-offs."""
    settings = ReviewSettings(workers=workers, lease=5.0, retry_backoff=0.0, poll=0.05)
    client = HubClient(token="hf_bot", timeout=10, limiter=RateLimiter(max_rps) if max_rps else None)
    return Reviewer(client, build_policy({}, source=None, overrides={}), open_queue(state), settings=settings)


class AppServer:
    """The webhook app on a real uvicorn server, on a random loopback port (its lifespan starts the workers)."""

    def __init__(self, reviewer: Reviewer) -> None:
        import uvicorn

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
        for _ in range(500):  # bounded wait for startup, no sleep: started is set by uvicorn
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
        self.reviewer.queue.close()


def make_pushes(hub: StandinHub, repo: str, count: int) -> list[Push]:
    """``count`` pushes to one repository: four in five to pull requests, the rest to main."""
    hub.add_repo(repo, {"model.safetensors": tiny_safetensors("F32"), "config.json": b"{}"})
    pushes = []
    for i in range(count):
        if i % 5 == 4:
            sha = hub.add_commit(repo, {"model.safetensors": tiny_safetensors("F16")}, replace=False)
            pushes.append(Push(repo, "refs/heads/main", sha))
        else:
            num, sha = hub.add_pull_request(repo, {"model.safetensors": tiny_safetensors("BF16")}, title=f"pr {i}")
            pushes.append(Push(repo, f"refs/pr/{num}", sha))
    return pushes


def answers(hub: StandinHub, pushes: Sequence[Push]) -> list[int]:
    """How many answers carrying each push's marker the stand-in holds."""
    with hub.lock:
        out = []
        for push in pushes:
            repo = hub.repos[push.repo]
            if push.ref.startswith("refs/pr/"):
                pr = repo.discussions[int(push.ref.rsplit("/", 1)[1]) - 1]
                out.append(sum(marker(push.sha) in text for _, text in pr.comments))
            else:  # the branch's thread: its description or one of its comments
                title = branch_thread_title(push.ref)
                out.append(sum(marker(push.sha) in text for d in repo.discussions if d.title == title
                               for text in (d.description, *(c for _, c in d.comments))))
        return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServiceProcess:
    """``ckpt-guard hub webhook`` in a process of its own, with test-sized leases."""

    def __init__(self, hub: StandinHub, work: Path, *, state: str, port: int | None = None,
                 kill_at: str | None = None, name: str = "svc", args: Sequence[str] = ()) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / f"{name}-{self.port}-{time.monotonic_ns()}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CKPT_GUARD_"))}
        env.update(PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   HF_ENDPOINT=hub.url, HF_HOME=str(work / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
                   HF_HUB_DISABLE_XET="1", NO_PROXY="127.0.0.1,localhost", XDG_CACHE_HOME=str(work / "cache"))
        if kill_at:
            env["CKPT_GUARD_KILL_AT"] = kill_at
        command = [sys.executable, "-m", "guard", "hub", "webhook", "--port", str(self.port), "--secret", SECRET,
                   "--state", state, "--token", "hf_bot", "--lease", "1.5", "--retry-backoff", "0.05",
                   "--log-format", "json", *args]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2, trust_env=False) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"the service exited ({self.proc.returncode}):\n{self.log_text()[-3000:]}")
                try:
                    if http.get(self.url + "/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)  # waiting for a process to bind its port: nothing to wait on
        raise AssertionError(f"the service did not start:\n{self.log_text()[-3000:]}")

    def wait_killed(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_text().splitlines() if line.startswith("{")]


@dataclass
class Sender:
    """Posts each delivery until acknowledged (2xx), cycling through ``urls``."""

    urls: list[str]
    attempts: int = 0
    refused: int = 0  # attempts that got no acknowledgement (connection lost, refused, 5xx)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _count(self, *, refused: bool) -> None:
        with self._lock:
            self.attempts += 1
            self.refused += refused

    def deliver(self, push: Push, index: int, *, deadline: float = 90.0) -> int:
        body = json.dumps(push.event())
        headers = {"X-Webhook-Secret": SECRET, "Content-Type": "application/json"}
        give_up = time.monotonic() + deadline
        turn = index
        with httpx.Client(timeout=10, trust_env=False) as http:
            while time.monotonic() < give_up:
                url = self.urls[turn % len(self.urls)]
                turn += 1
                try:
                    response = http.post(url + "/webhook", content=body, headers=headers)
                except httpx.TransportError:
                    response = None
                acknowledged = response is not None and response.status_code < 300
                self._count(refused=not acknowledged)
                if response is not None and acknowledged:
                    return response.status_code
                time.sleep(0.05)  # a redelivery a moment later, as the Hub does (much later)
        raise AssertionError(f"{push} was never acknowledged")

    def deliver_all(self, pushes: Sequence[Push], pool: ThreadPoolExecutor) -> list[Any]:
        return [pool.submit(self.deliver, push, i) for i, push in enumerate(pushes)]


def wait_until_answered(hub: StandinHub, pushes: Sequence[Push], service_url: str, *, timeout: float = 90.0) -> None:
    """Until every push has an answer and the queue holds nothing queued or running."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5, trust_env=False) as http:
        while time.monotonic() < deadline:
            if all(answers(hub, pushes)):
                health = http.get(service_url + "/healthz").json()
                if health["queued"] == 0 and health["running"] == 0:
                    return
            time.sleep(0.1)  # the answers come from another process: poll the stand-in
    raise AssertionError(f"not all answered in {timeout} s: {answers(hub, pushes)}")


def kill_scenario(hub: StandinHub, work: Path, *, state: str, point: str, at: int, replicas: int = 1,
                  count: int = 50, repo: str | None = None) -> dict[str, Any]:
    """Deliver ``count`` pushes; the first replica kills itself at the ``at``-th ``point``; restart it.

    Returns the figures: sent, deliveries (with redeliveries), answered, answered twice, lost.
    """
    pushes = make_pushes(hub, repo or f"kill/{point}-{replicas}", count)
    first = ServiceProcess(hub, work, state=state, kill_at=f"{point}:{at}", name="first")
    others = [ServiceProcess(hub, work, state=state, name=f"replica{i}") for i in range(1, replicas)]
    services = [first, *others]
    try:
        for service in services:
            service.wait_ready()
        sender = Sender([s.url for s in services])
        with ThreadPoolExecutor(8) as pool:
            futures = sender.deliver_all(pushes, pool)
            code = first.wait_killed()
            restarted = ServiceProcess(hub, work, state=state, port=first.port, name="restarted")
            services.append(restarted)
            restarted.wait_ready()
            for future in futures:
                future.result()
        wait_until_answered(hub, pushes, restarted.url)
        per_push = answers(hub, pushes)
        outcomes: dict[str, int] = {}
        for service in services:
            for record in service.log_records():
                if "outcome" in record:
                    outcomes[record["outcome"]] = outcomes.get(record["outcome"], 0) + 1
        return {"point": point, "at": at, "replicas": replicas, "killed_by": -code, "sent": count,
                "deliveries": sender.attempts, "unacknowledged": sender.refused,
                "answered": sum(1 for n in per_push if n >= 1), "answered_twice": sum(1 for n in per_push if n > 1),
                "lost": sum(1 for n in per_push if n == 0), "outcomes": outcomes}
    finally:
        for service in services:
            service.stop()
