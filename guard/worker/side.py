"""The one interface every worker side implements: a module per target, named by its row's ``side``.

A side knows one library: its distribution (``LIBRARY``), the version installed (``version()``), and
how to answer a request (``answer(request, out_dir)``): the body of the protocol's envelope, which
``guard.worker.__main__`` wraps the same way for every side.  A side that loads a checkpoint under a
target's loads answers with ``guard.worker.loads.run_loads``; parity's Flax side answers with its own
``"parity"`` object beside an empty ``"loads"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Side(Protocol):
    LIBRARY: str  # the distribution whose version the answer reports

    def version(self) -> str: ...

    def answer(self, request: dict[str, Any], out_dir: Path) -> dict[str, Any]:
        """The answer's body: ``"loads"`` (one record per load) and any key of the side's own."""
        ...
