"""Megatron's save folder: ``latest_checkpointed_iteration.txt`` and the ``iter_NNNNNNN/`` folders it names.

``megatron.training.checkpointing`` writes each save to ``<save>/iter_{iteration:07d}/`` (a torch_dist
checkpoint: DCP's files plus ``metadata.json`` and ``common.pt``, read by ``guard.training.dcp.dirs``) and then
the iteration (or ``release``) into ``<save>/latest_checkpointed_iteration.txt``; ``load_checkpoint`` follows
it.  The folder is claimed only when that file names no folder beside it (CG119); the iteration folders are
sets of their own.  ``convert`` given the save folder follows the file to the newest iteration.  NeMo 2 keeps
the same torch_dist files in ``<ckpt>/weights/`` beside ``<ckpt>/context/`` (``nemo_context``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from guard.catalogue import make_finding
from guard.records import Record
from guard.tensors import FileScan
from guard.training.dirs import TrainingDir
from guard.training.state import TrainingState, training_scan

LAYOUT = "megatron"
TRACKER = "latest_checkpointed_iteration.txt"
_MAX_TRACKER = 64
_ITERATION = re.compile(r"\d{1,12}")


class Tracked(Record):
    folder: str | None  # the iteration folder's name (None: the file names none)
    problem: str | None  # why it names no folder beside it; None when it does


def read_tracker(directory: str) -> Tracked | None:
    """What the tracker file names, or None where there is no readable one."""
    try:
        with open(os.path.join(directory, TRACKER), "rb") as fh:
            raw = fh.read(_MAX_TRACKER + 1)
    except OSError:
        return None
    return tracked(raw, lambda folder: os.path.isdir(os.path.join(directory, folder)))


def tracked(raw: bytes, is_folder: Callable[[str], bool]) -> Tracked:
    """What a tracker holding ``raw`` names; ``is_folder``: whether a name is a folder beside it (on disk, or in
    a Hub repository's listing)."""
    text = raw[:_MAX_TRACKER].decode("utf-8", "replace").strip()
    if text == "release":
        folder = "release"
    elif len(raw) <= _MAX_TRACKER and _ITERATION.fullmatch(text):
        folder = f"iter_{int(text):07d}"
    else:
        shown = text[:40].encode("unicode_escape").decode("ascii")
        return Tracked(None, f"{TRACKER} holds {shown!r}, which is neither an iteration nor 'release'")
    if not is_folder(folder):
        return Tracked(folder, f"{TRACKER} names iteration {text}, and there is no folder {folder}/ beside it")
    return Tracked(folder, None)


# NeMo 2's checkpoint: <ckpt>/weights/ (torch_dist) beside <ckpt>/context/ (io.json, model.yaml, artifacts and
# possibly cloudpickle files NeMo's `io` restores by unpickling): the context is listed by name, never opened.
NEMO_WEIGHTS, NEMO_CONTEXT = "weights", "context"
_MAX_CONTEXT_FILES = 10_000


def nemo_context(directory: str) -> tuple[str, ...] | None:
    """The files of NeMo 2's ``context/`` beside a ``weights/`` folder (relative names), or None: not NeMo 2's."""
    folder = os.path.normpath(directory)
    context = os.path.join(os.path.dirname(folder), NEMO_CONTEXT)
    if os.path.basename(folder) != NEMO_WEIGHTS or not os.path.isdir(context):
        return None
    found: list[str] = []
    for root, dirs, files in os.walk(context):
        dirs.sort()
        found += sorted(os.path.relpath(os.path.join(root, f), context) for f in files)
        if len(found) >= _MAX_CONTEXT_FILES:
            break
    return tuple(found[:_MAX_CONTEXT_FILES])


def claim(directory: str, names: frozenset[str]) -> TrainingDir | None:
    if TRACKER not in names:
        return None
    found = read_tracker(directory)
    if found is None or found.problem is None:
        return None  # the iteration folders are read on their own
    return TrainingDir(directory, LAYOUT, (TRACKER,))


def scan(found: TrainingDir, *, name: str) -> FileScan:
    read = read_tracker(found.directory)
    return tracker_scan(name, read.problem if read is not None and read.problem else f"{TRACKER} names no iteration")


def tracker_scan(name: str, problem: str) -> FileScan:
    """The set a save folder's broken tracker makes: no weights, one CG119 (a local scan's and a Hub scan's)."""
    path = f"{name.rstrip('/')}/{TRACKER}" if name not in ("", ".") else TRACKER
    state = TrainingState("Megatron-core (torch_dist)", "megatron-torch_dist", LAYOUT, None, "unknown", (), "module",
                          files=(TRACKER,))
    finding = make_finding("CG119", path, f"{problem}: Megatron's load_checkpoint fails on this folder")
    return training_scan(state, path=name, fmt="dcp", size=0, findings=[finding])
