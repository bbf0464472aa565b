"""A tiny progress bar: drawn on stderr only when it is a terminal, and never in CI."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sized
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
        total = len(iterable) if isinstance(iterable, Sized) else 0  # Sized: a class with __len__
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


def tensor_ticks(desc: str, total: int) -> Callable[[Iterator[T]], Iterator[T]]:
    """What ``guard.write.writer.write_output`` takes as ``ticks``: a bar that counts written tensors."""
    return lambda it: progress(it, total=total, desc=desc, unit="tensors")


class ByteProgress:
    """A byte-counting bar for streamed reads; thread-safe, silent unless worth showing."""

    def __init__(self, total: int, *, desc: str, min_bytes: int = 64 * 2**20) -> None:
        self.total, self.desc, self.done, self._shown = total, desc, 0, -1
        self._lock = threading.Lock()
        self.enabled = progress_enabled() and total >= min_bytes

    def advance(self, n: int) -> None:
        with self._lock:
            self.done += n
            percent = self.done * 100 // max(self.total, 1)
            if self.enabled and percent != self._shown:
                self._shown = percent
                _draw(self.done, self.total, f"{self.desc} ({self.total / 1e9:.2f} GB)", "bytes")

    def __enter__(self) -> ByteProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self._shown >= 0:
            sys.stderr.write("\n")
            sys.stderr.flush()
