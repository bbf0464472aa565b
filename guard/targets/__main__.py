"""``python -m guard.targets``: docs/jax.md's table of targets, as markdown on stdout."""

from __future__ import annotations

from guard.targets.doc import markdown_table

if __name__ == "__main__":
    print(markdown_table())
