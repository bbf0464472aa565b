"""The TorchScript and torch 0.4-era rows of docs/reliability.md's agreement table.

    .venv/bin/python fuzz/agreement_torchscript.py --count 2000

TorchScript mutants (tests/torchscript_agreement.py) against ``torch.jit.load`` in a
forked worker; torch 0.4-era legacy files (tests/torch04.py) against
``torch.load(weights_only=True)`` through the legacy differential of tests/fuzz_inputs.py.
Exit status 1 on an unexplained disagreement.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from agreement import print_row  # noqa: E402
from fuzz_inputs import differential_run  # noqa: E402
from torch04 import legacy_samples  # noqa: E402
from torchscript_agreement import agreement_run  # noqa: E402
from torchscript_samples import sample_torchscripts  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    legacy = legacy_samples()
    runs = (("torchscript", lambda: agreement_run(sample_torchscripts(), count=args.count, seed=args.seed)),
            ("torch-legacy (0.4-era)",
             lambda: differential_run("torch-legacy", legacy, count=args.count, seed=args.seed)))
    failed = False
    print("| reader | agree | documented categories | unexplained |")
    print("|---|---:|---|---:|")
    for name, run in runs:
        failed |= print_row(name, *run())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
