"""Remote scans: Hub files -> the same readers and inventory as a local scan.

One ``model_info(files_metadata=True)`` call lists a revision's files with their
sizes; weight files are read through ``HubFile`` ranged reads, config.json and
shard indexes are fetched whole (they are small).  Repositories scan in one
thread pool and their files in another, so an organisation audit is bounded by
latency rather than by the number of repositories.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from guard.catalogue import make_finding
from guard.config import Policy
from guard.errors import GuardError
from guard.hub.client import HubClient, hub_errors
from guard.hub.dcp_remote import listed_dcp_dirs, scan_dcp
from guard.hub.packages import fold_packages, package_scanner
from guard.hub.pointers import check_tracker, tracker_files
from guard.hub.remote import HubFile, RemoteBudgetExceeded
from guard.inventory import (
    CONFIG_NAME,
    MAX_JSON_BYTES,
    PIPELINE_INDEX,
    ModelInventory,
    build_inventory,
    is_index_file,
    is_weight_file,
    scan_weight,
    tf_dirs,
)
from guard.inventory.discovery import head_is_weights, may_be_weights
from guard.inventory.model import GENERATION_CONFIG, TOKEN_FILES, TOKENIZER, TOKENIZER_CONFIG
from guard.inventory.package_dirs import ir_members
from guard.inventory.pipelines import Pipeline, listed_pipelines
from guard.inventory.quant_conventions import QUANT_CONFIG_FILES  # quanto_qmap.json, quantize_config.json
from guard.records import Record
from guard.report import Report
from guard.scan import scan_inventories
from guard.tensors import FileScan

REPO_WORKERS = 8
FILE_WORKERS = 16


class RemoteFileStat(Record):
    path: str
    size: int
    requests: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "requests": self.requests, "bytes": self.bytes}


@dataclass  # mutable: scan_repo sets sha, error and pipelines and appends inventories and each file read as it goes
class RepoScan:
    repo_id: str
    revision: str | None  # as asked
    sha: str | None = None  # the commit that was read
    inventories: list[ModelInventory] = field(default_factory=list)
    pipelines: list[Pipeline] = field(default_factory=list)
    files: list[RemoteFileStat] = field(default_factory=list)
    error: GuardError | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "repo": self.repo_id, "revision": self.revision, "sha": self.sha,
            "requests": sum(f.requests for f in self.files), "bytes": sum(f.bytes for f in self.files),
            "files": [f.to_json() for f in self.files],
            "error": str(self.error) if self.error else None,
        }


class HubScanResult(Record):
    report: Report
    repos: list[RepoScan]

    @property
    def errors(self) -> list[GuardError]:
        return [r.error for r in self.repos if r.error is not None]


def list_author_models(client: HubClient, author: str) -> list[str]:
    with hub_errors(author, endpoint=client.endpoint):
        return client.call(lambda: [m.id for m in client.api.list_models(author=author)])


def scan_hub(repo_ids: Sequence[str], policy: Policy, client: HubClient, *, revision: str | None = None,
             repo_workers: int = REPO_WORKERS, file_workers: int | None = None,
             add: Sequence[str] = (), publishing: bool = False) -> HubScanResult:
    """Scan every repository that can be read; the others carry their error (exit 2 in the CLI).

    ``add``: `hub fix --add` requests, planned per model as a local scan plans them.  ``publishing``: each
    repository is judged as published (the Hub reviewer): CG120 for its training state, CG121 an error.
    """
    # Each repository has a config.json and at least one weight file in flight at once.
    file_workers = file_workers or max(FILE_WORKERS, 2 * repo_workers)
    with ThreadPoolExecutor(file_workers, thread_name_prefix="hub-file") as file_pool, \
            ThreadPoolExecutor(repo_workers, thread_name_prefix="hub-repo") as repo_pool:
        futures = [repo_pool.submit(scan_repo, client, repo_id, revision=revision, pool=file_pool)
                   for repo_id in repo_ids]
        repos = [f.result() for f in futures]
    report = scan_inventories((inv for r in repos for inv in r.inventories), policy,
                              pipelines=[p for r in repos for p in r.pipelines], add=add, publishing=None)
    _publishing_findings(report, repos, policy, publishing=publishing)
    report.extra["hub"] = {
        "endpoint": client.endpoint,
        "repos": [r.to_json() for r in repos],
        "requests": sum(f.requests for r in repos for f in r.files),
        "bytes": sum(f.bytes for r in repos for f in r.files),
        "retried": dict(client.retried),  # Hub answers that were asked again, by status (429, 503...)
    }
    return HubScanResult(report, repos)


def _publishing_findings(report: Report, repos: Sequence[RepoScan], policy: Policy, *, publishing: bool) -> None:
    """CG120/CG121 per repository (guard.rules.publishing): one repository's weights say nothing of another's."""
    from guard.rules.publishing import PublishingCheck
    from guard.scan import with_fix_field

    found = []
    for repo in repos:
        check = PublishingCheck()
        for inventory in repo.inventories:
            check.add(inventory)
        found += [with_fix_field(f) for f in check.findings(publishing=publishing) if policy.is_enabled(f.code, f.path)]
    if found:
        report.findings.extend(found)
        report.findings = report.sorted_findings()


def scan_repo(client: HubClient, repo_id: str, *, revision: str | None, pool: ThreadPoolExecutor) -> RepoScan:
    result = RepoScan(repo_id, revision)
    try:
        with hub_errors(repo_id, revision=revision, endpoint=client.endpoint):
            info = client.call(lambda: client.api.model_info(
                repo_id, revision=revision, files_metadata=True, timeout=client.timeout))
        result.sha = info.sha or revision or "main"
        siblings = info.siblings or []
        listed: dict[str, int | None] = {s.rfilename: _size(s) for s in siblings}
        siblings, packages = fold_packages(siblings)  # each Core ML package one entry (guard.hub.packages)
        scan_one = package_scanner(packages, _scan_weight, RemoteFileStat)
        checkpoints = orbax_checkpoints(siblings)  # each an inventory of its own, below
        zero = _zero_checkpoints(listed)  # DeepSpeed tag folders: one training-state set each, like Orbax
        dcp = {root: files for root, files in listed_dcp_dirs(listed).items() if root not in zero}  # DCP's too
        owned = {f"{root}/{n}" if root else n for part in (zero, dcp) for root, files in part.items() for n in files}
        groups = _group_by_directory([s for s in siblings if s.rfilename not in owned], inside=tuple(checkpoints))
        indexes = {s.rfilename: pool.submit(_fetch_json, client, repo_id, result.sha, s.rfilename, _size(s))
                   for s in siblings if posixpath.basename(s.rfilename) == PIPELINE_INDEX}
        # each a (scan, stat) pair; a tracker's scan is None where it names its tag
        orbax: list[tuple[str, Future[tuple[FileScan | None, RemoteFileStat]]]] = [
            (root, pool.submit(_scan_orbax, client, repo_id, result.sha, root, files))
            for root, files in checkpoints.items()]
        orbax += [(root, pool.submit(_scan_zero, client, repo_id, result.sha, root, files, listed))
                  for root, files in zero.items()]
        orbax += [(root, pool.submit(_scan_dcp, client, repo_id, result.sha, root, files))
                  for root, files in dcp.items()]
        orbax += [(posixpath.dirname(name), pool.submit(_check_tracker, client, repo_id, result.sha, name, listed))
                  for name in tracker_files(listed) if posixpath.dirname(name) not in zero]  # CG119
        pending = [
            (directory, [pool.submit(scan_one, client, repo_id, result.sha, name, size)
                         for name, size in weights],
             {name: pool.submit(_fetch_json, client, repo_id, result.sha, name, size)
              for name, size in jsons})
            for directory, (weights, jsons) in groups.items()
        ]
        checkpoint_scans = {root: scan for root, scan in ((root, _result(future, result)) for root, future in orbax)
                            if scan is not None}  # a `latest` that names its tag is no set
        for directory, weight_futures, json_futures in pending:
            scans = [scan for scan in (_result(f, result) for f in weight_futures) if scan is not None]
            json_files = {_display(repo_id, n): _result(f, result) for n, f in json_futures.items()}
            checkpoint = checkpoint_scans.pop(directory, None)  # as locally: one model with its config
            if checkpoint is not None:
                scans.append(checkpoint)
            elif not scans and not any(is_index_file(posixpath.basename(n)) for n in json_files):
                continue  # only files that turned out not to be weights (the same rule as the local scan)
            path = _display(repo_id, directory) if directory else repo_id
            result.inventories.append(build_inventory(
                path, tf_dirs.rebase_companions(scans, path), json_files=json_files,
                companion_size=partial(_listed_companion_size, listed, directory)))
        for scan in checkpoint_scans.values():  # a checkpoint with nothing beside it
            result.inventories.append(build_inventory(scan.path, [scan], json_files={}))
        fetched = {name: _result(f, result) for name, f in indexes.items()}
        result.pipelines = listed_pipelines((s.rfilename for s in siblings), fetched, prefix=repo_id)
    except GuardError as exc:
        result.error = exc
        result.inventories.clear()
        result.pipelines.clear()
    return result


def _result(future: Future[tuple[Any, RemoteFileStat]], into: RepoScan) -> Any:
    value, stat = future.result()  # a HubError propagates to scan_repo
    into.files.append(stat)
    return value


def _group_by_directory(siblings: Sequence[Any], *, inside: tuple[str, ...] = ()
                        ) -> dict[str, tuple[list[tuple[str, int | None]], list[tuple[str, int | None]]]]:
    """Weight files and JSON files by directory; ``inside``: checkpoint roots ("" for the repo's root).

    As a local scan: what lies below a root is the checkpoint's; beside its ``_METADATA``, files named
    as weights (never sniffed: those are the checkpoint's own) and config.json stay in the root's model.
    """
    groups: dict[str, tuple[list[tuple[str, int | None]], list[tuple[str, int | None]]]] = {}
    irs, ir_data = ir_members(s.rfilename for s in siblings)  # an IR's .bin is its .xml's, never read alone
    tf = tf_dirs.hub_listing(s.rfilename for s in siblings)
    for sibling in sorted(siblings, key=lambda s: s.rfilename):
        name: str = sibling.rfilename
        if name in ir_data or name in tf.members or (name.endswith(".index") and name not in tf.indexes):
            continue  # TF data shards and SavedModel graphs are their set's; other .index files not weights
        directory = tf.indexes.get(name, posixpath.dirname(name))  # variables/ is its SavedModel's
        if any(directory != root and (not root or name.startswith(root + "/")) for root in inside):
            continue
        base = posixpath.basename(name)
        size = _size(sibling)
        if (is_weight_file(base) or name in irs or name in tf.indexes
                or (directory not in inside and may_be_weights(base, size))):
            groups.setdefault(directory, ([], []))[0].append((name, size))
        elif base == CONFIG_NAME or base in QUANT_CONFIG_FILES or is_index_file(base) or base in TOKEN_FILES:
            groups.setdefault(directory, ([], []))[1].append((name, size))
    for _, jsons in groups.values():  # a generation config and a tokenizer: both, or none (what CG128 compares)
        names = {posixpath.basename(n) for n, _ in jsons}
        if GENERATION_CONFIG not in names or not names & {TOKENIZER_CONFIG, TOKENIZER}:
            jsons[:] = [(n, z) for n, z in jsons if posixpath.basename(n) not in TOKEN_FILES]
    # A directory with only a config.json is not a model (same rule as the local scan), unless a checkpoint.
    return {d: groups[d] for d in sorted(groups)
            if groups[d][0] or d in inside or any(is_index_file(posixpath.basename(n)) for n, _ in groups[d][1])}


def _listed_companion_size(listed: dict[str, int | None], directory: str, name: str) -> int | None:
    return _listed_size(listed, posixpath.join(directory, name) if directory else name)


def _listed_size(listed: dict[str, int | None], name: str) -> int | None:
    """A file's size from the listing; None when it is not there (a listed file without a size: no limit)."""
    if name not in listed:
        return None
    size = listed[name]
    return size if size is not None else 2**63


def _size(sibling: Any) -> int | None:
    return sibling.size if isinstance(getattr(sibling, "size", None), int) else None


# ---------------------------------------------------------------- Orbax hook
# An Orbax checkpoint is a directory: its listed files are grouped into one checkpoint and read
# through ranged reads of each (the reader opens only the small metadata and B-tree files).


def orbax_checkpoints(siblings: Sequence[Any]) -> dict[str, dict[str, int]]:
    """Checkpoint root ("" for the repo root) -> {path relative to it: size} of its files."""
    from guard.readers.orbax import CHECKPOINT_METADATA, METADATA

    names = {s.rfilename: s.size if isinstance(getattr(s, "size", None), int) else 0 for s in siblings}
    items = {posixpath.dirname(n) for n in names if posixpath.basename(n) == METADATA}
    steps = {posixpath.dirname(n) for n in names if posixpath.basename(n) == CHECKPOINT_METADATA}
    steps = {s for s in steps if any(i and posixpath.dirname(i) == s for i in items)}  # manager steps
    roots = steps | {i for i in items if not (i and posixpath.dirname(i) in steps)}
    roots = {r for r in roots if not any(o != r and (not o or r.startswith(o + "/")) for o in roots)}
    out: dict[str, dict[str, int]] = {}
    for root in sorted(roots):
        prefix = f"{root}/" if root else ""
        out[root] = {n[len(prefix):]: size for n, size in names.items() if n.startswith(prefix)}
    return out


def _scan_orbax(client: HubClient, repo_id: str, sha: str, root: str,
                files: dict[str, int]) -> tuple[FileScan, RemoteFileStat]:
    from guard.readers.orbax import read_orbax_checkpoint

    display = _display(repo_id, root) if root else repo_id
    opened: list[HubFile] = []

    def open_file(relative: str) -> HubFile:
        name = f"{root}/{relative}" if root else relative
        opened.append(HubFile(client, repo_id=repo_id, revision=sha, filename=name, size=files[relative],
                              name=_display(repo_id, name)))
        return opened[-1]

    return _read_folder(display, root, files, opened, lambda: read_orbax_checkpoint(display, files, open_file))


def _zero_checkpoints(listed: dict[str, int | None]) -> dict[str, dict[str, int]]:
    if not any(name.endswith(("_model_states.pt", "_optim_states.pt")) for name in listed):
        return {}  # guard.training is imported only for a repository that holds DeepSpeed's files
    from guard.training.deepspeed.dirs import listed_tag_dirs

    return listed_tag_dirs(listed)


def _check_tracker(client: HubClient, repo_id: str, sha: str, name: str,
                   listed: dict[str, int | None]) -> tuple[FileScan | None, RemoteFileStat]:
    """DeepSpeed's ``latest`` or Megatron's tracker, fetched whole and checked (guard.hub.pointers)."""
    def fetch(path: str) -> bytes:
        with hub_errors(repo_id, revision=sha, endpoint=client.endpoint):
            return client.get_whole(client.file_url(repo_id, path, sha))

    folder = posixpath.dirname(name)
    scan, read = check_tracker(name, listed, fetch, shown=_display(repo_id, folder) if folder else repo_id)
    return scan, RemoteFileStat(name, listed.get(name) or 0, 1 if read else 0, read)


def _scan_dcp(client: HubClient, repo_id: str, sha: str, root: str, files: dict[str, int]
              ) -> tuple[FileScan, RemoteFileStat]:
    display = _display(repo_id, root) if root else repo_id
    opened: list[HubFile] = []

    def read() -> FileScan:
        scan, got = scan_dcp(client, repo_id, sha, root, files, shown=display)
        opened.extend(got)
        return scan

    return _read_folder(display, root, files, opened, read)


def _scan_zero(client: HubClient, repo_id: str, sha: str, root: str, files: dict[str, int],
               listed: dict[str, int | None]) -> tuple[FileScan, RemoteFileStat]:
    from guard.training.deepspeed.dirs import scan_listed

    display = _display(repo_id, root) if root else repo_id
    opened: list[HubFile] = []

    def open_file(base: str, shown: str) -> HubFile:
        name = f"{root}/{base}" if root else base
        opened.append(HubFile(client, repo_id=repo_id, revision=sha, filename=name, size=files[base], name=shown))
        return opened[-1]

    beside = any(posixpath.join(folder, CONFIG_NAME) in listed for folder in {root, posixpath.dirname(root)})
    return _read_folder(display, root, files, opened,
                        lambda: scan_listed(display, files, open_file, config_beside=beside))


def _read_folder(display: str, root: str, files: dict[str, int], opened: list[HubFile],
                 read: Callable[[], FileScan]) -> tuple[FileScan, RemoteFileStat]:
    """A folder read through ranged reads: past the budget it is CG401; its requests and bytes counted."""
    try:
        scan = read()
    except RemoteBudgetExceeded as exc:
        scan = FileScan(path=display, format=None, size=sum(files.values()), findings=(make_finding(
            "CG401", display, f"not scannable through ranged reads: {exc}; scan it locally after download"),))
    stat = RemoteFileStat(root or ".", sum(files.values()), sum(f.requests for f in opened),
                          sum(f.bytes_read for f in opened))
    return scan._replace(bytes_read=stat.bytes), stat


def _display(repo_id: str, name: str) -> str:
    return f"{repo_id}/{name}"


def _scan_weight(client: HubClient, repo_id: str, sha: str, filename: str,
                 size: int | None) -> tuple[FileScan | None, RemoteFileStat]:
    extra = 0
    if size is None:  # no size in the listing: one HEAD
        size = _head_size(client, repo_id, sha, filename)
        extra = 1
    source = HubFile(client, repo_id=repo_id, revision=sha, filename=filename, size=size,
                     name=_display(repo_id, filename))
    # no weight suffix: weights only by its magic bytes (an .xml is listed here only as an OpenVINO IR)
    if not is_weight_file(posixpath.basename(filename)) and not filename.lower().endswith((".xml", ".index")):
        if not head_is_weights(source.read_at(0, min(16, size))):
            return None, RemoteFileStat(filename, size, source.requests + extra, source.bytes_read)
    try:
        scan = scan_weight(source)
    except RemoteBudgetExceeded as exc:
        scan = FileScan(path=source.name, format=None, size=size, findings=(make_finding(
            "CG401", source.name, f"not scannable through ranged reads: {exc}; scan it locally after download"),))
    scan = scan._replace(bytes_read=source.bytes_read)
    return scan, RemoteFileStat(filename, size, source.requests + extra, source.bytes_read)


def _head_size(client: HubClient, repo_id: str, sha: str, filename: str) -> int:
    from huggingface_hub import get_hf_file_metadata

    url = client.file_url(repo_id, filename, sha)
    with hub_errors(repo_id, revision=sha, endpoint=client.endpoint):
        meta = client.call(lambda: get_hf_file_metadata(url, token=client.token, timeout=client.timeout))
    return int(meta.size or 0)


TOKENIZER_HEAD = 1 << 20  # tokenizer.json's added tokens come before its vocabulary (guard.inventory.tokens)


def _fetch_json(client: HubClient, repo_id: str, sha: str, filename: str,
                size: int | None) -> tuple[bytes | None, RemoteFileStat]:
    if posixpath.basename(filename) == TOKENIZER and size is not None:  # its head, where its added tokens are
        source = HubFile(client, repo_id=repo_id, revision=sha, filename=filename, size=size,
                         name=_display(repo_id, filename))
        head = source.read_at(0, min(size, TOKENIZER_HEAD)) if size else b""
        return head, RemoteFileStat(filename, size, source.requests, source.bytes_read)
    if size is not None and size > MAX_JSON_BYTES:
        return b"\xff", RemoteFileStat(filename, size, 0, 0)  # reported as invalid JSON, as locally
    with hub_errors(repo_id, revision=sha, endpoint=client.endpoint):
        data = client.get_whole(client.file_url(repo_id, filename, sha))
    return data, RemoteFileStat(filename, len(data), 1, len(data))
