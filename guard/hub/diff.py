"""Two revisions of one Hub repository, compared from their headers (`hub diff`, the push reviewer).

Each side is a remote scan (``guard.hub.scan.scan_repo``: ranged reads of the weight headers,
config.json and indexes fetched whole), then ``guard.diff.compare_sides`` pairs the models and
weight sets as a local diff does.  No tensor data is read: values are never compared remotely.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from guard.config import Policy
from guard.hub.client import HubClient
from guard.hub.scan import FILE_WORKERS, RepoScan, scan_repo
from guard.records import Record

if TYPE_CHECKING:
    from guard.diff import ChangeReport


class HubChange(Record):
    change: ChangeReport
    old: RepoScan
    new: RepoScan

    def traffic(self) -> dict[str, Any]:
        """Requests and bytes each side cost (the JSON's ``extra.hub``; the benchmark's figure)."""
        return {"old": self.old.to_json(), "new": self.new.to_json()}


def read_sides(client: HubClient, repo_id: str, old: str, new: str) -> tuple[RepoScan, RepoScan]:
    """Both revisions scanned at once; each carries its error (a missing revision, a refused token)."""
    with ThreadPoolExecutor(FILE_WORKERS, thread_name_prefix="hub-file") as files, \
            ThreadPoolExecutor(2, thread_name_prefix="hub-side") as sides:
        futures = [sides.submit(scan_repo, client, repo_id, revision=rev, pool=files) for rev in (old, new)]
        before, after = (f.result() for f in futures)
    return before, after


def compare_scans(old: RepoScan, new: RepoScan, policy: Policy, *, old_label: str | None = None,
                  new_label: str | None = None, publishing: bool = False) -> ChangeReport:
    from guard.diff import Side, compare_sides

    def side(scan: RepoScan, label: str | None) -> Side:
        name = label or f"{scan.repo_id}@{scan.revision or 'main'}"
        return Side(name, tuple(scan.inventories), "", tuple(scan.pipelines))

    return compare_sides(side(old, old_label), side(new, new_label), policy, publishing=publishing)


def hub_change(client: HubClient, repo_id: str, old: str, new: str, policy: Policy, *,
               publishing: bool = False) -> HubChange:
    """The change from ``old`` to ``new``; raises the first side's HubError (exit 2 in the CLI)."""
    before, after = read_sides(client, repo_id, old, new)
    for scan in (before, after):
        if scan.error is not None:
            raise scan.error
    return HubChange(compare_scans(before, after, policy, publishing=publishing), before, after)
