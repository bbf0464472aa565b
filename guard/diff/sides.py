"""One side of a diff: the models read from a local path or a Hub revision, and the prefix they sit under."""

from __future__ import annotations

import os
from collections.abc import Sequence

from guard.errors import UsageError
from guard.inventory import (
    CONFIG_NAME,
    LocalModel,
    ModelInventory,
    discover_models,
    display_path,
    load_local_model,
)
from guard.inventory.pipelines import Pipeline, local_pipelines
from guard.paths import clean_path, path_parent
from guard.records import Record


class Side(Record):
    label: str  # what the views call this side: a path, "main@1a2b3c4", "base"
    inventories: tuple[ModelInventory, ...]
    root: str = ""  # display prefix of this side's paths, stripped to pair models and files across sides
    pipelines: tuple[Pipeline, ...] = ()


def local_side(path: str | os.PathLike[str], *, label: str | None = None) -> Side:
    """A directory (every model under it) or one weight file (that file alone, with its config.json).

    A file given alone is the change being asked about: its siblings (other shards, copies) stay out,
    where a scan of the same file reads its whole directory.
    """
    given = clean_path(path)
    if not os.path.exists(given):
        raise UsageError(f"{os.fspath(path)}: no such file or directory")
    if os.path.isdir(given):
        models = discover_models([given])
        root = display_path(given)
    else:
        folder = path_parent(given)
        config = os.path.join(folder, CONFIG_NAME)
        models = [LocalModel(folder, (given,), (config,) if os.path.isfile(config) else ())]
        root = display_path(folder)
    pipelines = local_pipelines((m.directory for m in models), display=display_path)
    return Side(label or os.fspath(path), tuple(load_local_model(m) for m in models), root, tuple(pipelines))


def relative(path: str, root: str) -> str:
    """``path`` under ``root``: "." for the root itself; a path outside it unchanged."""
    if not root or root == ".":
        return path
    if path == root:
        return "."
    prefix = root.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


def model_of(path: str, model_paths: Sequence[str]) -> str | None:
    """The model a finding's path belongs to: the longest model path equal to or above it."""
    best: str | None = None
    for model in model_paths:
        inside = model == "." and not path.startswith("/") and not path.startswith("../")
        if inside or path == model or path.startswith(model.rstrip("/") + "/"):
            if best is None or len(model) > len(best) or best == ".":
                best = model
    return best
