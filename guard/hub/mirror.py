"""A partial local copy of one Hub revision, and a scan of that revision with files replaced.

``download`` fetches only the named files (ranged GETs through ``HubClient``, checked against
the listing's hashes) into ``mirror/<repo_id>/`` (the paths the remote
scan's findings already use, so a fix's ``dir`` is a path under the mirror).  ``OverlayClient``
is a ``HubClient`` that serves some files of the revision from local paths and lists them
among the revision's files: a remote scan through it is the scan of the revision as a pull
request carrying those files would leave it, with every other file still read by ranges.
``same_as_listed`` says whether a local file already is the revision's file (its git blob
sha, or its LFS sha256): then there is nothing to propose.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from guard.hub.client import HubClient, hub_errors
from guard.hub.errors import HubError

OVERLAY = "overlay:"  # file_url prefix of a file served from the overlay
CHUNK = 32 << 20  # bytes per ranged GET of a download; also the hashing read size


def repo_relative(name: str) -> str | None:
    """``name`` as a path inside the repository, or None if it would leave it."""
    if not name or name.startswith("/") or "\\" in name:
        return None
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    return name


def download(client: HubClient, repo_id: str, revision: str, names: list[str], mirror: Path,
             listed: dict[str, Any]) -> dict[str, Path]:
    """Fetch ``names`` (repository paths) of ``revision`` into ``mirror/<repo_id>/``: repo path -> file.

    Through ``HubClient`` ranged reads of ``CHUNK`` bytes (one chunk in memory at a time, each
    retried as a read), then checked against the listing: its size and its git or LFS hash.
    """
    root = mirror / repo_id
    got: dict[str, Path] = {}
    for name in names:
        if repo_relative(name) is None or name not in listed:
            raise HubError(f"{repo_id}: a fix asks to read {name!r}, which is not a file of {revision[:12]}")
        size = listed[name].size if isinstance(getattr(listed[name], "size", None), int) else None
        url = client.file_url(repo_id, name, revision)
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with hub_errors(repo_id, revision=revision, endpoint=client.endpoint), open(target, "wb") as out:
            if size is None:
                out.write(client.get_whole(url))
            for start in range(0, size or 0, CHUNK):
                out.write(client.get_range(url, start, min(start + CHUNK, size or 0)))
        if size is not None and not same_as_listed(target, listed[name]):
            raise HubError(f"{repo_id}/{name}@{revision[:12]}: the downloaded bytes do not match the Hub's "
                           "listing (size or hash); run again")
        got[name] = target
    return got


def file_digests(path: Path) -> tuple[str, str]:
    """(git blob sha1, sha256) of a local file, streamed."""
    blob, sha256 = hashlib.sha1(b"blob %d\0" % path.stat().st_size), hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            blob.update(chunk)
            sha256.update(chunk)
    return blob.hexdigest(), sha256.hexdigest()


def same_as_listed(path: Path, sibling: Any) -> bool:
    """Whether the local file holds exactly the listed file's bytes (``model_info(files_metadata=True)``)."""
    if sibling is None:
        return False
    size = getattr(sibling, "size", None)
    if isinstance(size, int) and size != path.stat().st_size:
        return False
    blob, sha256 = file_digests(path)
    lfs = getattr(sibling, "lfs", None)
    lfs_sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
    if lfs_sha:
        return bool(lfs_sha == sha256)
    return bool(getattr(sibling, "blob_id", None) == blob)


@dataclass  # mutable: a HubClient (its counters), with the overlay's files
class OverlayClient(HubClient):
    """The revision with ``overlay`` (repo path -> local file) in place of, or beside, its own files."""

    overlay: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.api = _OverlayApi(self.api, self.overlay)

    def file_url(self, repo_id: str, filename: str, revision: str) -> str:
        if filename in self.overlay:
            return OVERLAY + filename
        return super().file_url(repo_id, filename, revision)

    def get_range(self, url: str, start: int, end: int) -> bytes:
        if not url.startswith(OVERLAY):
            return super().get_range(url, start, end)
        with open(self.overlay[url[len(OVERLAY):]], "rb") as fh:
            fh.seek(start)
            return fh.read(end - start)

    def get_whole(self, url: str) -> bytes:
        if not url.startswith(OVERLAY):
            return super().get_whole(url)
        return self.overlay[url[len(OVERLAY):]].read_bytes()


class _OverlayApi:
    """``HfApi`` whose ``model_info`` lists the overlay's files with their local sizes."""

    def __init__(self, api: Any, overlay: dict[str, Path]) -> None:
        self._api = api
        self._overlay = overlay

    def model_info(self, *args: Any, **kwargs: Any) -> Any:
        info = self._api.model_info(*args, **kwargs)
        siblings = [s for s in (info.siblings or []) if s.rfilename not in self._overlay]
        siblings += [SimpleNamespace(rfilename=name, size=path.stat().st_size, blob_id=None, lfs=None)
                     for name, path in sorted(self._overlay.items())]
        return SimpleNamespace(sha=info.sha, siblings=siblings)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


def overlay_client(client: HubClient, overlay: dict[str, Path]) -> OverlayClient:
    return OverlayClient(token=client.token, timeout=client.timeout, attempts=client.attempts,
                         backoff=client.backoff, deadline=client.deadline, limiter=client.limiter,
                         endpoint=client.endpoint, overlay=overlay)


def dir_in_repo(repo_id: str, display_dir: str) -> str | None:
    """A fix's ``dir`` (a display path, ``org/model/unet``) as a repository folder (``unet``; ``""`` the root)."""
    if display_dir == repo_id:
        return ""
    if not display_dir.startswith(repo_id + "/"):
        return None
    return repo_relative(display_dir[len(repo_id) + 1:])


def join(folder: str, name: str) -> str:
    return posixpath.join(folder, name) if folder else name
