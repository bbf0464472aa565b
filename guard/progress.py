"""A tiny progress bar: drawn on stderr only when it is a terminal, and never in CI."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
WIDTH = 24


def progress_enabled() -> bool:
    ci = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
    return not ci and sys.stderr.isatty()


def progress(iterable: Iterable[T], *, total: int | None = None, desc: str = "",
             unit: str = "it") -> Iterator[T]:
    """Yield from ``iterable``, drawing ``[#####   ] 42% desc`` as items pass."""
    if not progress_enabled():
        yield from iterable
        return
    if total is None:
        total = len(iterable) if hasattr(iterable, "__len__") else 0  # type: ignore[arg-type]
    done = 0
    _draw(done, total, desc, unit)
    try:
        for item in iterable:
            yield item
            done += 1
            _draw(done, total, desc, unit)
    finally:
        sys.stderr.write("\n")
        sys.stderr.flush()


def _draw(done: int, total: int, desc: str, unit: str) -> None:
    if total > 0:
        share = min(done / total, 1.0)
        filled = int(WIDTH * share)
        line = f"\r[{'#' * filled}{' ' * (WIDTH - filled)}] {share:4.0%} {desc} ({done}/{total} {unit})"
    else:
        line = f"\r{done} {unit} {desc}"
    sys.stderr.write(line)
    sys.stderr.flush()
