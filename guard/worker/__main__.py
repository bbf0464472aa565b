"""``python -m guard.worker``: one request on stdin, one answer on stdout (``guard.envs.protocol``).

The request names a target; its row in the one table of targets (``guard.targets.table``) names the side
(a ``guard.worker.side.Side`` module) that answers it.  Every answer is the same envelope: the protocol,
the library and its version, the JAX backend, and the side's body.  Log lines of the libraries go to
stderr; stdout carries only the answer.

``--warm TARGET``: the side's ``warm()`` (its imports) runs before stdin is read, so a parent that starts the
worker early (``guard.envs.worker.Started``) has them done by the time it asks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from guard.envs.protocol import PROTOCOL
from guard.lazy import resolve
from guard.targets import TARGETS
from guard.worker.side import Side

SIDES = {name: row.side for name, row in TARGETS.items() if row.side}  # target -> its side's module


def side_of(target: str) -> Side:
    side = resolve(SIDES[target])
    if not isinstance(side, Side):
        raise TypeError(f"{SIDES[target]} does not implement guard.worker.side.Side")
    return side


def answer(request: dict[str, Any]) -> dict[str, Any]:
    from guard.parity.accelerator import backend_figures

    side = side_of(request["target"])
    body = side.answer(request, Path(request["out_dir"]))
    return {"protocol": PROTOCOL, "library": {"name": side.LIBRARY, "version": side.version()},
            "backend": backend_figures(), "loads": [], **body}


def main() -> int:
    if sys.argv[1:2] == ["--warm"] and sys.argv[2:3] and sys.argv[2] in SIDES:
        warm = getattr(side_of(sys.argv[2]), "warm", None)
        if warm is not None:
            warm()
    request = json.loads(sys.stdin.read())
    if request.get("protocol") != PROTOCOL or request.get("target") not in SIDES:
        print(json.dumps({"protocol": PROTOCOL, "error": "unknown protocol or target"}))
        return 2
    reply = answer(request)
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
