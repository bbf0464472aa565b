"""The PyTorch side's imports, less what transformers brings along that parity never runs.

transformers imports some packages only because they are installed (``is_hqq_available`` and the like), and
three of them cost the PyTorch side of parity more than its own forward passes: ``hqq`` (transformers'
``cache_utils`` imports it for a quantized generation cache; it imports torch's compiler, ``torch._inductor``
and ``torch._dynamo``'s test tools), ``torchao`` (a quantizer) and ``kernels`` (the Hub's kernels, used only
when a model is loaded with ``use_kernels``).  Parity loads a plain checkpoint with eager attention and runs
one forward pass (a quantized source is dequantized by ckpt-guard and paired with itself), so it uses none.

``hidden()`` makes them look absent while transformers is first imported: their ``sys.modules`` entry is
None, which ``importlib.util.find_spec`` answers with None and ``import`` with an ImportError, the standard
way to block an import.  Only a process that has not imported transformers yet is trimmed (transformers
decides once, at import); the entries are removed again on the way out, so a later ``import hqq`` of the
same process works (transformers keeps its decision that they are absent).  The measured cost is in
docs/benchmarks.md ("Parity's fixed cost"); ``tests/test_parity_fixed_cost.py`` checks none is imported.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

UNNEEDED = ("hqq", "torchao", "kernels")


@contextlib.contextmanager
def hidden() -> Iterator[None]:
    if "transformers" in sys.modules:  # too late: transformers has looked for them already
        yield
        return
    blocked = [name for name in UNNEEDED if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # None in sys.modules: the import is refused
    try:
        yield
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
