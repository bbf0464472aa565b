"""atheris target: a DCP ``.metadata`` (the allow-list walker, the records, the integrity checks).

An input is the bytes of ``.metadata``; ``tests/fuzz_formats_training.read_dcp_metadata_input`` does what a
scan does with it.  Anything outside ``READ_FAILURES`` escaping is a crash atheris saves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

with atheris.instrument_imports(include=["guard"]):
    import guard.training.dcp.integrity  # noqa: F401  (instrumented before the shared input imports them)
    import guard.training.dcp.layout  # noqa: F401
    import guard.training.dcp.roles  # noqa: F401
    # the readers above are instrumented first: the shared input below imports them
    # isort: split
    from fuzz_formats_training import read_dcp_metadata_input


if __name__ == "__main__":
    atheris.Setup(sys.argv, read_dcp_metadata_input)
    atheris.Fuzz()
