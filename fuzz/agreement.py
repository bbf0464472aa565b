"""The differential agreement figures of docs/reliability.md: seeded mutations of real files, per reader.

    .venv/bin/python fuzz/agreement.py --count 5000 gguf onnx npy npz torch-zip

For each reader, ``count`` mutants of the files ``tests/fuzz_inputs.sample_checkpoints``
writes with the real libraries are scanned by us and read by the reference reader;
each verdict pair is "agree", a documented category (``KNOWN_DISAGREEMENTS``) or
UNEXPLAINED (a bug: exit status 1, and the first few are printed).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzz_inputs import FILE_NAMES, differential_run, sample_checkpoints  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("readers", nargs="*", default=list(FILE_NAMES))
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)  # gguf-py and torch log on every refused mutant
    failed = False
    print("| reader | agree | documented categories | unexplained |")
    print("|---|---:|---|---:|")
    for fmt in args.readers:
        tally, unexplained = differential_run(fmt, sample_checkpoints(fmt), count=args.count, seed=args.seed)
        failed |= print_row(fmt, tally, unexplained)
    return 1 if failed else 0


def print_row(name: str, tally: Counter[str], unexplained: list[tuple[bytes, str]]) -> bool:
    """One table row (and the first unexplained inputs, on stderr); True if any was unexplained."""
    total = sum(tally.values())
    others = ", ".join(f"`{k}` {v}" for k, v in sorted(tally.items()) if k not in ("agree", "UNEXPLAINED"))
    print(f"| {name} | {100 * tally['agree'] / total:.2f} % ({tally['agree']:,} / {total:,}) | {others or '-'} "
          f"| {tally['UNEXPLAINED']} |", flush=True)
    for data, why in unexplained[:3]:
        print(f"    UNEXPLAINED {why[:300]} ({len(data)} bytes)", file=sys.stderr)
    return bool(unexplained)


if __name__ == "__main__":
    raise SystemExit(main())
