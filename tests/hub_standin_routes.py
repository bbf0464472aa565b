"""Request routing and repository state for the stand-in Hub (see ``hub_standin``)."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub_standin import StandinHub

Response = tuple[int, dict[str, str], bytes]
LFS_SUFFIXES = (".safetensors", ".bin", ".msgpack", ".pt", ".pth", ".ckpt", ".h5")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class Discussion:
    num: int
    title: str
    description: str
    is_pr: bool
    author: str
    status: str = "open"
    ref: str | None = None  # refs/pr/N
    comments: list[tuple[str, str]] = field(default_factory=list)  # (author, markdown)
    created: str = field(default_factory=_now)
    base: str | None = None  # a pull request: the commit of its target branch it started from
    target: str = "main"  # a pull request: the branch it merges into

    def summary(self, repo_id: str) -> dict[str, Any]:
        return {"num": self.num, "title": self.title, "status": self.status, "isPullRequest": self.is_pr,
                "createdAt": self.created, "author": {"name": self.author}, "pinned": False,
                "repo": {"name": repo_id, "type": "model"}, "numComments": len(self.comments) + 1}


@dataclass
class Repo:
    repo_id: str
    private: bool = False
    gated: bool = False
    refs: dict[str, str] = field(default_factory=dict)  # "main" / "refs/pr/1" -> sha
    discussions: list[Discussion] = field(default_factory=list)


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]
    summary: str
    description: str = ""
    repo_id: str = ""
    parent: str | None = None
    author: str = "alice"
    created: str = field(default_factory=_now)

    def to_json(self) -> dict[str, Any]:
        """As ``GET /api/models/{repo}/commits/{rev}`` lists it (``message`` is the body under the title)."""
        return {"id": self.sha, "title": self.summary, "message": self.description,
                "authors": [{"user": self.author}], "date": self.created}


@dataclass
class Request:
    method: str
    segments: list[str]
    query: dict[str, list[str]]
    body: bytes
    headers: dict[str, str]  # lower-cased names
    user: str | None

    def json(self) -> Any:
        return json.loads(self.body or b"{}")

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(path: str, data: bytes) -> bool:
    return path.endswith(LFS_SUFFIXES) or len(data) > 10 * 1024 * 1024


def _json(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    return status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(obj).encode()


def _error(status: int, code: str | None, message: str, headers: dict[str, str] | None = None) -> Response:
    extra = {"X-Error-Message": message, **(headers or {})}
    if code:
        extra["X-Error-Code"] = code
    return _json(status, {"error": message}, extra)


class Routes:
    """One request against the stand-in's state (callers hold no lock; we take it)."""

    def __init__(self, hub: StandinHub, request: Request) -> None:
        self.hub = hub
        self.r = request

    def dispatch(self) -> Response:
        seg, method = self.r.segments, self.r.method
        with self.hub.lock:
            if seg[:1] == ["api"]:
                if seg[1:2] == ["agent-harnesses"]:
                    return _error(404, None, "not here")
                if seg[1:2] == ["whoami-v2"] and method == "GET":
                    return self.whoami()
                reads = ("paths-info", "validate-yaml")  # POSTs that read
                if method == "POST" and self.r.user is not None and self.read_only() \
                        and not any(r in seg for r in reads):
                    return _error(403, None, "You don't have the rights to perform this action "
                                             "(read-only token)")
                if seg[1:3] == ["repos", "create"] and method == "POST":
                    return self.create_repo()
                if seg[1:2] == ["validate-yaml"]:
                    return _json(200, {"errors": [], "warnings": []})
                if seg[1:2] == ["models"] and len(seg) == 2 and method == "GET":
                    return self.list_models()
                if seg[1:2] == ["models"] and len(seg) >= 4:
                    return self.model_api("/".join(seg[2:4]), seg[4:])
            if len(seg) >= 5 and seg[2] == "resolve" and method in ("GET", "HEAD"):
                return self.resolve("/".join(seg[:2]), seg[3], "/".join(seg[4:]))
            return _error(404, None, "no such route")

    # ------------------------------------------------------------ helpers
    def read_only(self) -> bool:
        return self.hub.token_roles.get(self.r.headers.get("authorization", "")[7:], "write") == "read"

    def whoami(self) -> Response:
        if self.r.user is None:
            return _error(401, None, "Invalid credentials in Authorization header")
        token = self.r.headers.get("authorization", "")[7:]
        role = self.hub.token_roles.get(token, "write")
        access: dict[str, Any] = {"displayName": "test token", "role": role, "createdAt": _now()}
        if role == "fineGrained":
            access["fineGrained"] = self.hub.fine_grained.get(token, {"global": [], "scoped": []})
        return _json(200, {"type": "user", "id": f"id-{self.r.user}", "name": self.r.user,
                           "fullname": self.r.user, "orgs": [], "isPro": False,
                           "auth": {"type": "access_token", "accessToken": access}})

    def _repo(self, repo_id: str) -> Repo | Response:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and self.r.user is None):
            status = 401 if self.r.user is None else 404
            return _error(status, "RepoNotFound", "Repository not found")
        return repo

    def _sha(self, repo: Repo, rev: str) -> str | None:
        rev = rev[len("refs/heads/"):] if rev.startswith("refs/heads/") else rev
        if rev in repo.refs:
            return repo.refs[rev]
        commit = self.hub.commits.get(rev)
        return rev if commit is not None and commit.repo_id == repo.repo_id else None

    def _siblings(self, files: dict[str, bytes], blobs: bool) -> list[dict[str, Any]]:
        out = []
        for path, data in sorted(files.items()):
            entry: dict[str, Any] = {"rfilename": path}
            if blobs:
                entry.update(size=len(data), blobId=git_blob_sha(data))
                if is_lfs(path, data):
                    entry["lfs"] = {"size": len(data), "sha256": sha256_hex(data), "pointerSize": 134}
            out.append(entry)
        return out

    # ------------------------------------------------------------ read side
    def list_models(self) -> Response:
        author = self.r.param("author")
        items = [
            {"id": repo.repo_id, "modelId": repo.repo_id, "private": repo.private, "sha": repo.refs.get("main")}
            for repo in self.hub.repos.values()
            if (author is None or repo.repo_id.split("/")[0] == author) and (not repo.private or self.r.user)
        ]
        return _json(200, items)

    def model_api(self, repo_id: str, rest: list[str]) -> Response:
        method = self.r.method
        if rest[:1] == ["discussions"]:
            return self.discussions(repo_id, rest[1:])
        found = self._repo(repo_id)
        if not isinstance(found, Repo):
            return found
        repo = found
        if method == "GET" and (rest == [] or rest[:1] == ["revision"]):
            rev = rest[1] if len(rest) > 1 else "main"
            sha = self._sha(repo, rev)
            if sha is None:
                return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            blobs = (self.r.param("blobs") or "").lower() in ("true", "1")
            return _json(200, {"id": repo_id, "modelId": repo_id, "sha": sha, "private": repo.private,
                               "gated": "auto" if repo.gated else False, "disabled": False, "tags": [],
                               "siblings": self._siblings(self.hub.commits[sha].files, blobs)})
        if method == "GET" and rest[:1] == ["commits"] and len(rest) >= 2:
            sha = self._sha(repo, rest[1])
            if sha is None:
                return _error(404, "RevisionNotFound", f"Invalid rev id: {rest[1]}")
            history: list[dict[str, Any]] = []
            at: str | None = sha
            while at is not None:
                history.append(self.hub.commits[at].to_json())
                at = self.hub.commits[at].parent
            return _json(200, history)
        if method == "GET" and rest[:1] == ["tree"] and len(rest) >= 2:
            sha = self._sha(repo, rest[1])
            if sha is None:
                return _error(404, "RevisionNotFound", f"Invalid rev id: {rest[1]}")
            prefix = "/".join(rest[2:])
            return _json(200, [
                {"type": "file", "path": p, "oid": git_blob_sha(d), "size": len(d),
                 **({"lfs": {"oid": sha256_hex(d), "size": len(d), "pointerSize": 134}} if is_lfs(p, d) else {})}
                for p, d in sorted(self.hub.commits[sha].files.items()) if p.startswith(prefix)
            ])
        if self.r.user is None:
            return _error(401, None, "Invalid credentials in Authorization header")
        if method == "POST" and rest[:1] == ["preupload"]:
            files = self.r.json().get("files", [])
            return _json(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                         for f in files]})
        if method == "POST" and rest[:1] == ["commit"] and len(rest) == 2:
            return self.commit(repo, rest[1])
        if method == "POST" and rest[:1] == ["branch"] and len(rest) == 2:
            if rest[1] in repo.refs:
                return _error(409, None, "Reference already exists")
            start = (json.loads(self.r.body or b"{}") or {}).get("startingPoint") or "main"
            repo.refs[rest[1]] = self._sha(repo, start) or repo.refs["main"]
            return _json(200, {})
        return _error(404, None, "no such route")

    def resolve(self, repo_id: str, rev: str, path: str) -> Response:
        found = self._repo(repo_id)
        if not isinstance(found, Repo):
            return found
        if found.gated and self.r.user is None:
            return _error(401, "GatedRepo", "Access to this model is restricted")
        sha = self._sha(found, rev)
        if sha is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        data = self.hub.commits[sha].files.get(path)
        if data is None:
            return _error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
        etag = sha256_hex(data) if is_lfs(path, data) else git_blob_sha(data)
        headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        spec = self.r.headers.get("range")
        if spec is None:
            return 200, {**headers, "Content-Length": str(len(data))}, data
        span = _parse_range(spec, len(data))
        if span is None:
            return 416, {**headers, "Content-Range": f"bytes */{len(data)}"}, b""
        start, end = span
        body = data[start : end + 1]
        return 206, {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}",
                     "Content-Length": str(len(body))}, body

    # ------------------------------------------------------------ write side
    def create_repo(self) -> Response:
        if self.r.user is None:
            return _error(401, None, "Invalid credentials in Authorization header")
        body = self.r.json()
        repo_id = f"{body.get('organization') or self.r.user}/{body['name']}"
        url = f"{self.hub.url}/{repo_id}"
        if repo_id in self.hub.repos:
            return _json(409, {"error": "You already created this model repo", "url": url})
        # huggingface_hub < 2 sends {"private": true}; 2.x sends {"visibility": "private"} (the Hub takes both)
        private = bool(body.get("private")) or body.get("visibility") in ("private", "protected")
        self.hub.add_repo(repo_id, private=private)
        return _json(200, {"url": url, "name": repo_id})

    def commit(self, repo: Repo, rev: str) -> Response:
        lines = [json.loads(line) for line in self.r.body.splitlines() if line.strip()]
        header = next(item["value"] for item in lines if item["key"] == "header")
        base_sha = self._sha(repo, rev)
        if base_sha is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        parent = header.get("parentCommit")
        if parent and self.r.param("create_pr") == "1":  # a pull request starts from the given commit
            if self._sha(repo, parent) != parent:
                return _error(404, "RevisionNotFound", f"Invalid parent commit: {parent}")
            base_sha = parent
        elif parent and parent != base_sha:
            return _error(412, None, "A commit has happened since. Please refresh and try again.")
        files = dict(self.hub.commits[base_sha].files)
        for item in lines:
            value = item["value"]
            if item["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "deletedFile":
                files.pop(value["path"], None)
        pr_url = None
        ref = rev
        if self.r.param("create_pr") == "1":
            num = self.hub.next_num(repo)
            ref = f"refs/pr/{num}"
            target = rev.removeprefix("refs/heads/") if rev in repo.refs or rev.startswith("refs/heads/") else "main"
            repo.discussions.append(Discussion(num, header.get("summary", ""), header.get("description", ""),
                                               True, self.r.user or "?", status="draft", ref=ref, base=base_sha,
                                               target=target))
            pr_url = f"{self.hub.url}/{repo.repo_id}/discussions/{num}"
        repo.refs[ref] = base_sha
        sha = self.hub.add_commit(repo.repo_id, files, ref=ref, summary=header.get("summary", ""),
                                  description=header.get("description", ""), author=self.r.user or "?")
        self.hub.received_commits.append((repo.repo_id, ref, header, sorted(files)))
        return _json(200, {"commitUrl": f"{self.hub.url}/{repo.repo_id}/commit/{sha}", "commitOid": sha,
                           "pullRequestUrl": pr_url})

    def discussions(self, repo_id: str, rest: list[str]) -> Response:
        found = self._repo(repo_id)
        if not isinstance(found, Repo):
            return found
        repo, method = found, self.r.method
        if not rest and method == "GET":
            if (self.r.param("p") or "0") != "0":
                return _json(200, {"discussions": [], "count": len(repo.discussions), "start": 0})
            items = [d for d in repo.discussions
                     if self.r.param("author") in (None, d.author)
                     and self.r.param("type") in (None, "all", "pull_request" if d.is_pr else "discussion")
                     and self.r.param("status") in (None, "all", d.status)]
            items.reverse()  # newest first, as the Hub
            return _json(200, {"discussions": [d.summary(repo_id) for d in items], "count": len(items),
                               "start": 0})
        if self.r.user is None and method == "POST":
            return _error(401, None, "Invalid credentials in Authorization header")
        if not rest and method == "POST":
            return self.create_discussion(repo)
        if not rest or not rest[0].isdigit() or not 1 <= int(rest[0]) <= len(repo.discussions):
            return _error(404, None, "Discussion not found")
        discussion = repo.discussions[int(rest[0]) - 1]
        if len(rest) == 1 and method == "GET":
            return _json(200, self._details(repo_id, discussion))
        if rest[1:] == ["merge"] and method == "POST":
            if not discussion.is_pr or discussion.status not in ("open", "draft"):
                return _error(400, None, "This pull request cannot be merged")
            self.hub.merge_pull_request(repo_id, discussion.num)
            return _json(200, {})
        if rest[1:] == ["status"] and method == "POST":  # HfApi.change_discussion_status
            status = self.r.json().get("status")
            if status not in ("open", "closed"):
                return _error(400, None, "status must be open or closed")
            discussion.status = status
            return _json(200, {"newStatus": {"id": f"{discussion.num}-status", "type": "status-change",
                                             "createdAt": _now(), "author": {"name": self.r.user or "?"},
                                             "data": {"status": status}}})
        if rest[1:] == ["comment"] and method == "POST":
            text = self.r.json()["comment"]
            discussion.comments.append((self.r.user or "?", text))
            return _json(200, {"newMessage": _event(f"{discussion.num}-{len(discussion.comments)}",
                                                    self.r.user or "?", text)})
        return _error(404, None, "no such route")

    def create_discussion(self, repo: Repo) -> Response:
        body = self.r.json()
        num = self.hub.next_num(repo)
        is_pr = bool(body.get("pullRequest"))
        discussion = Discussion(num, body["title"], body.get("description", ""), is_pr, self.r.user or "?",
                                status="draft" if is_pr else "open", ref=f"refs/pr/{num}" if is_pr else None)
        if is_pr:
            repo.refs[f"refs/pr/{num}"] = discussion.base = repo.refs["main"]
        repo.discussions.append(discussion)
        return _json(200, {"num": num, "url": f"{self.hub.url}/{repo.repo_id}/discussions/{num}"})

    def _details(self, repo_id: str, d: Discussion) -> dict[str, Any]:
        events = [_event(f"{d.num}-0", d.author, d.description)]
        events += [_event(f"{d.num}-{i}", author, text) for i, (author, text) in enumerate(d.comments, 1)]
        details = {**d.summary(repo_id), "events": events}
        if d.is_pr:
            details.update(changes={"base": f"refs/heads/{d.target}"}, filesWithConflicts=[], diff="")
        return details


def _event(event_id: str, author: str, text: str) -> dict[str, Any]:
    return {"id": event_id, "type": "comment", "createdAt": _now(), "author": {"name": author},
            "data": {"edited": False, "hidden": False, "numEdits": 0, "latest": {"raw": text, "html": text}}}


def _parse_range(spec: str, size: int) -> tuple[int, int] | None:
    if not spec.startswith("bytes=") or "," in spec:
        return None
    first, _, last = spec[6:].partition("-")
    try:
        if first == "":
            start, end = max(0, size - int(last)), size - 1
        else:
            start = int(first)
            end = min(int(last), size - 1) if last else size - 1
    except ValueError:
        return None
    return (start, end) if 0 <= start <= end < size else None
