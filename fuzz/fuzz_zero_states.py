"""atheris target: one DeepSpeed ZeRO rank file (``*_model_states.pt`` or ``*_optim_states.pt``), or one file
of ``ds_to_universal``'s ``zero/`` folder (``<param>/fp32.pt``, ``exp_avg.pt``, ``optimizer_state.pt``).

An input is the bytes of a rank file; ``tests/fuzz_formats_training.read_zero_input`` walks its zip and
pickle with DeepSpeed's inert classes allowed and reads it as both kinds of states.  Anything outside
``READ_FAILURES`` escaping is a crash atheris saves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

with atheris.instrument_imports(include=["guard"]):
    import guard.training.deepspeed.files  # noqa: F401  (instrumented before the shared input imports them)
    import guard.training.deepspeed.records  # noqa: F401
    import guard.training.deepspeed.universal  # noqa: F401  (ds_to_universal's parameter files, same target)
    # the readers above are instrumented first: the shared input below imports them
    # isort: split
    from fuzz_formats_training import read_zero_input


def one_input(data: bytes) -> None:
    read_zero_input(data)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
