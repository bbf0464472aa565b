"""The command line: ``ckpt-guard scan|rules|report|convert|parity|hub``.

One module per command group (``scan``, ``rules``, ``report``, ``convert``,
``parity``, ``hub``).  What they share: the flag table (``flags``, no click), the
work after parsing (``run``: policy, scan, emit; no click) and the click options
built from the table (``options``); none of these imports a command.  The click
root group (``root``) loads a command's module only when that command runs, so
``ckpt-guard scan`` never pays for convert, parity or the Hub, and ``--help``
still lists them all.  The hook's plain ``scan`` invocations skip click entirely
(``flags.parse_plain``).  This package may import any part of guard; nothing
outside it imports from it but ``__main__``.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Sequence

from guard.errors import GuardError


def main(argv: Sequence[str] | None = None) -> int:
    args = list(argv) if argv is not None else sys.argv[1:]
    fast = _plain_scan(args)
    if fast is not None:  # the hook's own spellings: no click to import
        # A scan builds acyclic records (tuples, dicts of them): the collector finds nothing, but at
        # the default threshold of 700 allocations it runs dozens of times per hook call, each full
        # pass over every module's objects too (callgrind: 4 % of the pipeline commit's instructions).
        # A rarer young collection still bounds any cyclic garbage (a hostile pickle can build
        # cycles); the modules, frozen once imported, are never walked again, nor is a file's records
        # once it is read (guard.collector).  Only for the process itself: a caller's main([...])
        # (tests, an embedding tool) keeps its collector as it was.
        process = argv is None
        if process:
            gc.set_threshold(10_000)
        from guard.cli.run import run_scan

        if process:
            from guard.collector import own_process

            own_process()
        options, paths = fast
        return _plain(lambda: run_scan(tuple(paths), **options), process=process)  # type: ignore[arg-type]  # the parsed options, of run_scan's types
    if args[:1] in (["diff"], ["textconv"]):  # git's textconv driver and plain diffs: no click either
        from guard.cli.review import plain_review

        review = plain_review(args)
        if review is not None:
            return _plain(review, process=argv is None)
    from guard.cli.root import run

    return run(args)


def _plain(command: Callable[[], int], *, process: bool) -> int:
    """Run a command parsed without click: one line and exit 2 for the tool's own failures."""
    try:
        code = int(command())
    except GuardError as exc:
        print(f"ckpt-guard: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ckpt-guard: interrupted", file=sys.stderr)
        return 130
    if process:
        # The report is written and flushed and nothing else is left to run: the OS takes the
        # memory back at once, where the interpreter's teardown would free every object and
        # module one by one (callgrind: 5 M instructions, about 1 ms of each hook call).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _plain_scan(args: list[str]) -> tuple[dict[str, object], list[str]] | None:
    if not args or args[0] != "scan":
        return None
    from guard.cli.flags import SCAN_FLAGS, parse_plain

    return parse_plain(args[1:], SCAN_FLAGS)
