"""PyTorch DCP checkpoints in a Hub repository (FSDP2, Accelerate, torchtitan, Megatron-core torch_dist),
read as a local scan reads them: ``.metadata`` (or each ``__R.metadata``) fetched by ranged reads and parsed
by the allow-listed walk (CG003 for anything else), Megatron's ``common.pt`` walked the same way, and the
``.distcp`` data files only listed, with their sizes, for the integrity checks (CG114-CG117).

A folder is a DCP checkpoint when its listing holds a ``.distcp`` file: a lone ``.metadata`` of another tool
is not fetched to find out.  The folder becomes one training-state set, whose files leave the weight groups.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from guard.tensors import FileScan

if TYPE_CHECKING:
    from guard.hub.client import HubClient
    from guard.hub.remote import HubFile


def listed_dcp_dirs(listed: dict[str, int | None]) -> dict[str, dict[str, int]]:
    """A repository listing's DCP folders (path -> {file name: size}, every file of the folder)."""
    if not any(name.endswith(".distcp") or _may_be_hf_shard(name) for name in listed):
        return {}  # guard.training is imported only for a repository that holds DCP's files
    from guard.training.dcp.dirs import claim_listed

    folders: dict[str, dict[str, int]] = {}
    for path, size in listed.items():
        folder, _, base = path.rpartition("/")
        folders.setdefault(folder, {})[base] = size or 0
    return {folder: {n: files[n] for n in claim_listed(frozenset(files))}
            for folder, files in folders.items() if claim_listed(frozenset(files))}


def _may_be_hf_shard(name: str) -> bool:
    """The HF storage writer's ``shard-0000K-model-0000I-of-0000N.safetensors``, told without the regex's import."""
    base = posixpath.basename(name)
    return base.startswith("shard-") and "-model-" in base and base.endswith(".safetensors")


def scan_dcp(client: HubClient, repo_id: str, sha: str, root: str, files: dict[str, int], *, shown: str
             ) -> tuple[FileScan, list[HubFile]]:
    """The folder's set, and the Hub files it read (for the request and byte counts)."""
    from guard.hub.remote import HubFile
    from guard.training.dcp.dirs import scan_listed
    from guard.training.megatron.common import MAX_COMMON_BYTES, check_common_source

    opened: list[HubFile] = []

    def open_file(base: str, display: str) -> HubFile:
        name = posixpath.join(root, base) if root else base
        opened.append(HubFile(client, repo_id=repo_id, revision=sha, filename=name, size=files[base], name=display))
        return opened[-1]

    def read_whole(base: str, limit: int) -> bytes:
        source = open_file(base, f"{shown}/{base}")
        return source.read_at(0, min(limit, source.size))

    def common(display: str) -> tuple[list, int]:
        from guard.catalogue import make_finding

        size = files["common.pt"]
        if size > MAX_COMMON_BYTES:
            return [make_finding("CG001", display, f"{size:,} bytes, past the read limit for Megatron's common "
                                 "state")], 0
        return check_common_source(open_file("common.pt", display), shown=display)

    def scan_shard(base: str, display: str) -> FileScan:
        from guard.inventory import scan_weight

        return scan_weight(open_file(base, display))

    return scan_listed(shown, files, read_whole, common, scan_shard), opened
