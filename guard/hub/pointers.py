"""A Hub repository's training trackers, checked as a local scan checks them (CG119).

DeepSpeed's ``latest`` names the tag folder ``load_checkpoint`` and ``zero_to_fp32.py`` read; Megatron's
``latest_checkpointed_iteration.txt`` names the ``iter_NNNNNNN/`` (or ``release/``) folder its
``load_checkpoint`` reads.  A listing says which folders exist; the tracker itself (a few bytes) is fetched
whole.  Which files are trackers is decided from the listing alone: ``latest`` anywhere (DeepSpeed's only
when ``zero_to_fp32.py`` is beside it or it names a ``global_stepN``, as locally) and Megatron's file by its
name.  A tracker that names its folder makes no set; a broken one makes the set a local scan makes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable

from guard.tensors import FileScan

DEEPSPEED_LATEST = "latest"
DEEPSPEED_SCRIPT = "zero_to_fp32.py"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
MAX_TRACKER_BYTES = 4096  # larger is no tracker of either: not fetched, judged as what its size says
FetchWhole = Callable[[str], bytes]  # repository path -> its bytes


def tracker_files(listed: dict[str, int | None]) -> list[str]:
    """The repository paths of every tracker file in a listing, sorted."""
    return sorted(n for n in listed if posixpath.basename(n) in (DEEPSPEED_LATEST, MEGATRON_TRACKER))


def check_tracker(name: str, listed: dict[str, int | None], fetch: FetchWhole, *, shown: str
                  ) -> tuple[FileScan | None, int]:
    """The set a broken tracker makes (None when it names its folder, or is no trainer's) and the bytes read.
    ``shown``: the folder's name in findings (``org/repo/sub``)."""
    folder, base = posixpath.split(name)
    size = listed.get(name) or 0
    raw = fetch(name) if size <= MAX_TRACKER_BYTES else b"\xff" * (MAX_TRACKER_BYTES + 1)
    read = len(raw) if size <= MAX_TRACKER_BYTES else 0
    folders = _folders(folder, listed)
    if base == MEGATRON_TRACKER:
        from guard.training.megatron.dirs import tracked, tracker_scan

        problem = tracked(raw, folders.__contains__).problem
        return (tracker_scan(shown, problem) if problem else None), read
    from guard.training.deepspeed.dirs import latest_scan, tag_problem

    script = posixpath.join(folder, DEEPSPEED_SCRIPT) in listed
    problem = tag_problem(raw, folders, script=script)
    return (latest_scan(shown, problem) if problem else None), read


def _folders(folder: str, listed: dict[str, int | None]) -> frozenset[str]:
    """The folders directly under ``folder`` that hold at least one listed file."""
    prefix = f"{folder}/" if folder else ""
    return frozenset(n[len(prefix):].split("/", 1)[0] for n in listed
                     if n.startswith(prefix) and "/" in n[len(prefix):])
