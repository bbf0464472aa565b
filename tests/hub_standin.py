"""A loopback stand-in for the Hugging Face Hub: the endpoints huggingface_hub calls.

Serves model repositories (branches, ``refs/pr/N``, commits by sha and their
history), ranged and whole resolve GETs, HEAD metadata, ``list_models(author=)``,
``whoami-v2`` (each token's account and role: a ``read`` token is refused every
write with 403), ``create_repo``, preupload + commit (the single-commit path,
``parentCommit`` honoured), discussions, pull requests (listed, with their base
commit, merged by ``merge_pull_request`` or the merge route) and comments.
Every request is recorded (method, path, status, bytes sent, when it arrived)
so tests and the benchmark can count what a client really asked for, and how
fast.  Faults (5xx, a stalled response, any status with headers such as
``Retry-After``), a rate-limit mode that turns away every N-th request with 429
or 503 and ``Retry-After`` without handling it, and a per-request latency can
be injected; a fault with ``after`` answers only once the request was handled
(a write made, then refused on the way back: the worst case for a retry).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from hub_standin_routes import Commit, Discussion, Repo, Request, Routes


@dataclass(frozen=True)
class Record:
    method: str
    path: str  # unquoted path without the query
    query: str
    status: int
    bytes: int  # body bytes sent
    range: str | None
    authorized: bool
    at: float = 0.0  # time.monotonic() when the request arrived


@dataclass
class Fault:
    method: str
    contains: str
    status: int | None  # None: stall until the stand-in stops
    remaining: int
    headers: dict[str, str] | None = None
    after: bool = False  # handle the request first, then answer with the fault (the worst case for a write)


@dataclass(frozen=True)
class Throttle:
    every: int  # the N-th, 2N-th, ... request is turned away
    status: int  # 429 or 503
    retry_after: str | None  # the Retry-After header, or None to send none


class StandinHub:
    def __init__(self, *, tokens: dict[str, str] | None = None, latency: float = 0.0) -> None:
        self.tokens = tokens if tokens is not None else {"hf_reader": "reader", "hf_bot": "ckpt-guard-bot"}
        # a token's role as whoami-v2 reports it: "read" tokens are refused every POST (403); absent: "write"
        self.token_roles: dict[str, str] = {"hf_reader": "read"}
        self.fine_grained: dict[str, dict[str, Any]] = {}  # token -> whoami's "fineGrained" object
        self.latency = latency
        self.repos: dict[str, Repo] = {}
        self.commits: dict[str, Commit] = {}
        self.records: list[Record] = []
        self.faults: list[Fault] = []
        self.throttling: Throttle | None = None
        self._arrivals = 0
        self.received_commits: list[tuple[str, str, dict[str, Any], list[str]]] = []
        self.lock = threading.RLock()
        self.release = threading.Event()
        self._counter = 0
        self._server: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()
        self.url = ""

    # ------------------------------------------------------------ set-up
    def add_repo(self, repo_id: str, files: dict[str, bytes] | Path | None = None, *, private: bool = False,
                 gated: bool = False) -> str:
        with self.lock:
            self.repos[repo_id] = Repo(repo_id, private=private, gated=gated)
            return self.add_commit(repo_id, files or {}, summary="initial commit")

    def add_commit(self, repo_id: str, files: dict[str, bytes] | Path, *, ref: str = "main",
                   summary: str = "update", description: str = "", replace: bool = True,
                   author: str = "alice") -> str:
        if isinstance(files, Path):
            files = {p.relative_to(files).as_posix(): p.read_bytes() for p in sorted(files.rglob("*"))
                     if p.is_file()}
        with self.lock:
            repo = self.repos[repo_id]
            base = {} if replace or ref not in repo.refs else dict(self.commits[repo.refs[ref]].files)
            base.update(files)
            self._counter += 1
            sha = hashlib.sha1(f"{repo_id}{self._counter}{sorted(base)}".encode()).hexdigest()
            self.commits[sha] = Commit(sha, base, summary, description, repo_id, parent=repo.refs.get(ref),
                                       author=author)
            repo.refs[ref] = sha
            return sha

    def add_pull_request(self, repo_id: str, files: dict[str, bytes], *, title: str = "PR",
                         author: str = "alice") -> tuple[int, str]:
        with self.lock:
            repo = self.repos[repo_id]
            num = self.next_num(repo)
            ref = f"refs/pr/{num}"
            repo.refs[ref] = base = repo.refs["main"]
            sha = self.add_commit(repo_id, files, ref=ref, summary=title, replace=False, author=author)
            repo.discussions.append(Discussion(num, title, "", True, author, status="draft", ref=ref, base=base))
            return num, sha

    def merge_pull_request(self, repo_id: str, num: int) -> str:
        """Merge ``refs/pr/num`` into its branch: fast-forward when the branch has not moved, else a merge
        commit carrying the pull request's changes; the pull request is then ``merged``."""
        with self.lock:
            repo = self.repos[repo_id]
            pr = repo.discussions[num - 1]
            assert pr.is_pr and pr.ref is not None, "not a pull request"
            head = repo.refs[pr.ref]
            if repo.refs[pr.target] == pr.base:
                repo.refs[pr.target] = head
            else:
                before = self.commits[pr.base].files if pr.base else {}
                after = self.commits[head].files
                changed = {p: d for p, d in after.items() if before.get(p) != d}
                gone = set(before) - set(after)
                files = {p: d for p, d in self.commits[repo.refs[pr.target]].files.items() if p not in gone}
                files.update(changed)
                self.add_commit(repo_id, files, ref=pr.target, summary=f"Merge pull request #{num}")
            pr.status = "merged"
            return repo.refs[pr.target]

    def fail(self, method: str, contains: str, status: int | None, times: int = 1,
             headers: dict[str, str] | None = None, *, after: bool = False) -> None:
        """The next ``times`` requests matching answer ``status``; ``after``: they are handled first."""
        with self.lock:
            self.faults.append(Fault(method, contains, status, times, headers, after))

    def throttle(self, every: int, *, status: int = 429, retry_after: str | None = "1") -> None:
        """Turn away every ``every``-th request from now on (0 stops), as the Hub's rate limiter does."""
        with self.lock:
            self.throttling = Throttle(every, status, retry_after) if every else None
            self._arrivals = 0

    @staticmethod
    def next_num(repo: Repo) -> int:
        return len(repo.discussions) + 1

    # ------------------------------------------------------------ queries for tests
    def files_at(self, repo_id: str, ref: str = "main") -> dict[str, bytes]:
        with self.lock:
            return dict(self.commits[self.repos[repo_id].refs[ref]].files)

    def matching(self, *, method: str | None = None, contains: str = "") -> list[Record]:
        with self.lock:
            return [r for r in self.records if (method is None or r.method == method) and contains in r.path]

    def reset_records(self) -> None:
        with self.lock:
            self.records.clear()

    def busiest_window(self, seconds: float, records: list[Record] | None = None) -> int:
        """The most requests that arrived within any ``seconds``-long window."""
        with self.lock:
            times = sorted(r.at for r in (self.records if records is None else records))
        most, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] >= seconds:
                first += 1
            most = max(most, last - first + 1)
        return most

    # ------------------------------------------------------------ lifecycle
    def start(self) -> StandinHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_GET(self) -> None:
                hub._handle(self, "GET")

            def do_HEAD(self) -> None:
                hub._handle(self, "HEAD")

            def do_POST(self) -> None:
                hub._handle(self, "POST")

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

            def get_request(self) -> tuple[socket.socket, Any]:
                conn, address = super().get_request()
                with hub.lock:
                    hub._connections.add(conn)
                return conn, address

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client killed mid-connection (the kill tests) resets it: not the stand-in's problem.
                if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
                    super().handle_error(request, client_address)

            def shutdown_request(self, request: Any) -> None:
                with hub.lock:
                    hub._connections.discard(request)
                super().shutdown_request(request)

        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="standin-hub", daemon=True).start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        # Kept-alive connections would otherwise go on serving this (stopped) hub
        # to a client that reuses them, e.g. if the next stand-in gets the same port.
        with self.lock:
            for conn in list(self._connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._connections.clear()

    def __enter__(self) -> StandinHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ dispatch
    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        arrived = time.monotonic()
        if self.latency:
            time.sleep(self.latency)
        split = urlsplit(handler.path)
        segments = [unquote(s) for s in split.path.split("/")[1:]]
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        auth = handler.headers.get("Authorization", "")
        user = self.tokens.get(auth[7:]) if auth.startswith("Bearer ") else None
        fault = self._throttled() or self._fault(method, unquote(split.path))
        if fault is not None and fault.status is None:
            self.release.wait(30)
            handler.close_connection = True
            return
        if fault is None or fault.after:
            headers = {k.lower(): v for k, v in handler.headers.items()}
            request = Request(method, segments, parse_qs(split.query), body, headers, user)
            status, headers, payload = Routes(self, request).dispatch()
        if fault is not None:
            status, payload = fault.status or 500, b"injected fault"
            headers = {"Content-Type": "text/plain", **(fault.headers or {})}
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        if "Content-Length" not in headers:
            handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        sent = 0
        if method != "HEAD":
            handler.wfile.write(payload)
            sent = len(payload)
        with self.lock:
            self.records.append(Record(method, unquote(split.path), split.query, status, sent,
                                       handler.headers.get("Range"), user is not None, arrived))

    def _throttled(self) -> Fault | None:
        with self.lock:
            rule = self.throttling
            if rule is None:
                return None
            self._arrivals += 1
            if self._arrivals % rule.every:
                return None
        headers = {"Retry-After": rule.retry_after} if rule.retry_after is not None else {}
        return Fault("*", "", rule.status, 1, headers)

    def _fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.remaining > 0 and fault.method == method and fault.contains in path:
                    fault.remaining -= 1
                    return fault
        return None




# ---------------------------------------------------------------- pytest wiring


def point_client_at(url: str, monkeypatch: Any, home: Path) -> None:
    """Aim huggingface_hub (already imported or not) at ``url``, with HOME, cache and token in ``home``."""
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    from huggingface_hub import constants

    # The client reads HF_ENDPOINT once, at import; patch what it derived from it.
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "hf" / "token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    import guard.hub.client

    monkeypatch.setattr(guard.hub.client, "BACKOFF", 0.0)


def standin_fixture(monkeypatch: Any, tmp_path: Path) -> Iterator[StandinHub]:
    hub = StandinHub().start()
    point_client_at(hub.url, monkeypatch, tmp_path)
    try:
        yield hub
    finally:
        hub.stop()


# ---------------------------------------------------------------- small inputs without numpy

LFS_POINTER_EXAMPLE = (b"version https://git-lfs.github.com/spec/v1\n"
                       b"oid sha256:" + b"ab" * 32 + b"\nsize 123456789\n")


def tiny_safetensors(dtype: str = "F32") -> bytes:
    """An fp32 tensor ``w`` plus a tensor ``b`` of ``dtype`` (F32, F16 or BF16)."""
    width = {"F32": 4, "F16": 2, "BF16": 2}[dtype]
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": dtype, "shape": [2], "data_offsets": [8, 8 + 2 * width]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(8 + 2 * width)
