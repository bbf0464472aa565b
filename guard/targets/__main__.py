"""``python -m guard.targets``: docs/jax.md's table of targets, as markdown on stdout.

``python -m guard.targets to`` / ``against``: the ``--to`` / ``--against`` choices, one a line;
``python -m guard.targets needs NAME``: what ``--against NAME`` needs in the Python running ckpt-guard, one
``extra EXTRA`` (a ckpt-guard extra) or ``pip REQUIREMENT`` a line.  For scripts, such as the Action's, that
check an input and install ckpt-guard before running it: the stacks are the table's, never a list of their own.
"""

from __future__ import annotations

import sys

from guard.targets import TARGETS, against_choices, to_choices
from guard.targets.doc import markdown_table

USAGE = "usage: python -m guard.targets [to | against | needs NAME]"


def needs(name: str) -> list[str]:
    row = TARGETS[name]
    env = row.environment_row
    return ([f"extra {extra}" for extra in ("parity", *row.extras)]
            + [f"pip {requirement}" for requirement in (env.beside if env else ())])


def main(argv: list[str]) -> int:
    if not argv:
        print(markdown_table())
        return 0
    if argv[0] == "needs" and len(argv) == 2 and argv[1] in against_choices():
        print("\n".join(needs(argv[1])))
        return 0
    choices = {"to": to_choices, "against": against_choices}.get(argv[0])
    if choices is None or len(argv) > 1:
        print(USAGE, file=sys.stderr)
        return 2
    print("\n".join(choices()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
