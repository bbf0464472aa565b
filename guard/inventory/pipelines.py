"""diffusers pipelines: a root whose ``model_index.json`` names its components.

A variant is only loadable if every component that has weights carries it
(CG109), so the check needs each component's file names, nothing more: no
header of a sibling component is read for it.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Mapping

from guard import jsonload
from guard.inventory.model import MAX_JSON_BYTES, PIPELINE_INDEX
from guard.paths import clean_path, path_parent
from guard.records import Record

MAX_COMPONENTS = 256


class Pipeline(Record):
    path: str  # the root, as displayed
    components: dict[str, tuple[str, ...]]  # component folder -> the file names in it


def component_names(data: bytes | None) -> list[str]:
    """The folders ``model_index.json`` names: keys whose value is ``[library, class]``."""
    if data is None or len(data) > MAX_JSON_BYTES:
        return []
    try:
        parsed = jsonload.parse(data, "model_index.json")
    except ValueError:
        return []  # a broken model_index.json is diffusers' to report; the components still scan
    if not isinstance(parsed, dict):
        return []
    names = [key for key, value in parsed.items()
             if isinstance(key, str) and not key.startswith("_") and _is_component(key, value)]
    return names[:MAX_COMPONENTS]


def _is_component(key: str, value: object) -> bool:
    return (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)
            and "/" not in key and key not in (".", ".."))


def local_pipelines(directories: Iterable[str | os.PathLike[str]], *,
                    display: Callable[[str | os.PathLike[str]], str]) -> list[Pipeline]:
    """Pipelines whose root is one of, or the parent of one of, the model directories."""
    roots: dict[str, None] = {}
    for raw in directories:
        directory = clean_path(raw)
        for candidate in (directory, path_parent(directory)):
            if os.path.isfile(os.path.join(candidate, PIPELINE_INDEX)):
                roots.setdefault(candidate, None)
    pipelines = []
    for root in roots:
        try:
            with open(os.path.join(root, PIPELINE_INDEX), "rb") as fh:
                data = fh.read(MAX_JSON_BYTES + 1)
        except OSError:
            continue
        components: dict[str, tuple[str, ...]] = {}
        for name in component_names(data):
            try:
                with os.scandir(os.path.join(root, name)) as listing:
                    files = tuple(sorted(entry.name for entry in listing if entry.is_file()))
            except OSError:
                continue  # a component folder that is absent: diffusers' own error, not a variant's
            components[name] = files
        pipelines.append(Pipeline(display(root), components))
    return pipelines


def listed_pipelines(files: Iterable[str], fetched: Mapping[str, bytes | None], *, prefix: str) -> list[Pipeline]:
    """The same from a repository listing (Hub scans): ``fetched`` holds each model_index.json."""
    names = list(files)
    pipelines = []
    for index_path, data in sorted(fetched.items()):
        root = posixpath.dirname(index_path)
        components: dict[str, tuple[str, ...]] = {}
        for component in component_names(data):
            folder = posixpath.join(root, component) if root else component
            inside = tuple(sorted(posixpath.basename(n) for n in names if posixpath.dirname(n) == folder))
            if inside:
                components[component] = inside
        pipelines.append(Pipeline(f"{prefix}/{root}" if root else prefix, components))
    return pipelines
