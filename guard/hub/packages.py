"""Core ML packages on the Hub: a package's listed files become one entry of the listing, read as one set.

The local scan walks a ``.mlpackage`` folder as one set (``guard.inventory.package_dirs``);
here the listing's files under ``X.mlpackage/`` are folded into one pseudo-file
``X.mlpackage`` whose scan opens only the Manifest and the weights files, with
ranged reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from guard.catalogue import make_finding
from guard.hub.client import HubClient
from guard.hub.remote import HubFile, RemoteBudgetExceeded
from guard.inventory.package_dirs import hub_packages, in_package
from guard.readers import READ_FAILURES, unreadable
from guard.records import Record
from guard.sources import BytesSource
from guard.tensors import FileScan


class PackageEntry(Record):
    rfilename: str
    size: int


def fold_packages(siblings: Sequence[Any]) -> tuple[list[Any], dict[str, dict[str, int]]]:
    """(the listing with each package's files replaced by one entry, package root -> {relative: size})."""
    roots = hub_packages(s.rfilename for s in siblings)
    if not roots:
        return list(siblings), {}
    packages: dict[str, dict[str, int]] = {root: {} for root in roots}
    kept: list[Any] = []
    for sibling in siblings:
        root = next((r for r in roots if in_package(sibling.rfilename, (r,))), None)
        if root is None:
            kept.append(sibling)
            continue
        size = sibling.size if isinstance(getattr(sibling, "size", None), int) else 0
        packages[root][sibling.rfilename[len(root) + 1:]] = size
    kept += [PackageEntry(root, sum(files.values())) for root, files in packages.items()]
    return kept, packages


def package_scanner(packages: dict[str, dict[str, int]], scan_file: Callable[..., Any],
                    stat: Callable[..., Any]) -> Callable[..., Any]:
    """``scan_file`` for the listing's files, the package reader for the folded packages; ``stat`` makes the
    per-file request record (guard.hub.scan's RemoteFileStat: passed in, so neither module imports the other)."""
    if not packages:
        return scan_file

    def scan(client: HubClient, repo_id: str, sha: str, filename: str, size: int | None) -> Any:
        if filename in packages:
            return scan_remote_package(client, repo_id, sha, filename, packages[filename], stat=stat)
        return scan_file(client, repo_id, sha, filename, size)

    return scan


def scan_remote_package(client: HubClient, repo_id: str, sha: str, root: str, files: dict[str, int], *,
                        stat: Callable[..., Any]) -> tuple[FileScan, Any]:
    from guard.readers.coreml.blob import read_mlpackage

    display = f"{repo_id}/{root}"
    opened: list[HubFile] = []

    def open_file(relative: str) -> HubFile:
        if relative not in files:
            raise KeyError(relative)
        opened.append(HubFile(client, repo_id=repo_id, revision=sha, filename=f"{root}/{relative}",
                              size=files[relative], name=f"{display}/{relative}"))
        return opened[-1]

    try:
        scan = read_mlpackage(display, files, open_file)
    except READ_FAILURES as exc:
        scan = unreadable(BytesSource(b"", name=display), exc)
    except RemoteBudgetExceeded as exc:
        scan = FileScan(path=display, format=None, size=sum(files.values()), findings=(make_finding(
            "CG401", display, f"not scannable through ranged reads: {exc}; scan it locally after download"),))
    record = stat(root, sum(files.values()), sum(f.requests for f in opened), sum(f.bytes_read for f in opened))
    return scan._replace(bytes_read=record.bytes), record
