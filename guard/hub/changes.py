"""What a push changed on the Hub, from two listings: the files whose blob differs.

The reviewer stays quiet for a push that touched no checkpoint file: ``model_info(files_metadata=True)``
of both revisions lists every file with its git blob id (and its LFS sha256), so two small JSON answers
tell which paths were added, removed or rewritten, without reading a byte of them.  What counts as a
checkpoint file is the pre-commit hook's ``files:`` pattern (weights, shard indexes, config.json,
model_index.json, Orbax and OpenVINO metadata): a README, a tokenizer or a licence edit is not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from guard.hub.client import HubClient, hub_errors
from guard.records import Record

# The same selection as .pre-commit-hooks.yaml's `files:` and the action's select.sh (a test keeps them equal).
CHECKPOINT_FILES = re.compile(
    r"(\.(safetensors|bin|pt|pth|jit|ptl|pt2|pte|ckpt|msgpack|h5|hdf5|keras|gguf|onnx|npz|npy|tflite|ot|mlmodel"
    r"|pdparams|caffemodel|distcp|nemo|engine|plan|llamafile|pb|index|data-[0-9]{5}-of-[0-9]{5})"
    r"|\.index(\.[^./]+)?\.json|(^|/)(config|model_index)\.json|(^|/)(_METADATA|_CHECKPOINT_METADATA|manifest\.ocdbt)"
    r"|(^|/)openvino_[^/]*\.xml)$", re.I)


class PushChanges(Record):
    added: tuple[str, ...]
    removed: tuple[str, ...]
    modified: tuple[str, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted((*self.added, *self.removed, *self.modified)))

    @property
    def checkpoint_paths(self) -> tuple[str, ...]:
        return tuple(p for p in self.paths if CHECKPOINT_FILES.search(p))


def listing(client: HubClient, repo_id: str, revision: str) -> dict[str, str]:
    """path -> the blob's identity at ``revision`` (LFS sha256 where there is one, else the git blob id)."""
    with hub_errors(repo_id, revision=revision, endpoint=client.endpoint):
        info = client.call(lambda: client.api.model_info(repo_id, revision=revision, files_metadata=True,
                                                         timeout=client.timeout))
    out = {}
    for sibling in info.siblings or []:
        lfs = getattr(sibling, "lfs", None)
        digest = getattr(lfs, "sha256", None) if lfs is not None else None
        out[sibling.rfilename] = str(digest or getattr(sibling, "blob_id", None) or f"size:{sibling.size}")
    return out


def compare_listings(old: Mapping[str, str], new: Mapping[str, str]) -> PushChanges:
    return PushChanges(added=tuple(sorted(set(new) - set(old))), removed=tuple(sorted(set(old) - set(new))),
                       modified=tuple(sorted(p for p in set(old) & set(new) if old[p] != new[p])))


def push_changes(client: HubClient, repo_id: str, old: str, new: str) -> PushChanges:
    return compare_listings(listing(client, repo_id, old), listing(client, repo_id, new))
