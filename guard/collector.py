"""The cyclic garbage collector in the command line's own process (never in a library caller's).

A scan builds records: tuples of strings and numbers, one per tensor (a safetensors file's
columns instead: a few lists per file), alive until the report is written.  Record classes are
tuple subclasses, which the collector never untracks, so each young
collection walks every record made since the last one, and an older collection walks them again:
at 200,000 tensors that is 8 % of a sharded model's scan, and it finds nothing (records hold no
cycles).  So in its own process the command line takes each file's records out of the collector's
reach as soon as the file is read (``gc.freeze``: they move to the permanent generation, which no
collection walks), and a file read by a reader that can build cycles (a pickle's memo can make a
list that holds itself) is collected first, while its garbage is the only young thing there is:
no cyclic garbage is ever frozen, and no record is walked twice.

``own_process`` is called by the command line's ``main`` for the process it runs in; a caller of
``main([...])`` (tests, an embedding tool) keeps its collector as it was, and ``settle`` does nothing.
"""

from __future__ import annotations

import gc

# formats whose readers build no cycles (strings, numbers, tuples, dicts from JSON or msgpack)
_ACYCLIC = frozenset({"safetensors", "gguf", "npy", "lfs-pointer", "flax-msgpack"})
_owned = False


def own_process() -> None:
    """The command line's process, its modules imported: freeze them (never walked again), and settle files."""
    global _owned
    gc.freeze()
    _owned = True


def settle(scan_format: str | None) -> None:
    """After a file is read (its format, None where unreadable): collect what a cyclic reader left, then
    freeze what is alive, its records among it."""
    if not _owned:
        return
    if scan_format not in _ACYCLIC:
        gc.collect()  # walks only what is not frozen: this file's objects and its garbage
    gc.freeze()
