"""``python -m guard.targets``: docs/jax.md's table of targets, as markdown on stdout.

``python -m guard.targets to`` / ``against``: the ``--to`` / ``--against`` choices, one a line (for
scripts, such as the Action's, that check an input before running ckpt-guard).
"""

from __future__ import annotations

import sys

from guard.targets import against_choices, to_choices
from guard.targets.doc import markdown_table


def main(argv: list[str]) -> int:
    if not argv:
        print(markdown_table())
        return 0
    choices = {"to": to_choices, "against": against_choices}.get(argv[0])
    if choices is None or len(argv) > 1:
        print("usage: python -m guard.targets [to | against]", file=sys.stderr)
        return 2
    print("\n".join(choices()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
