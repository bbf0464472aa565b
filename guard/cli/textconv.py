"""`ckpt-guard textconv FILE`: the git diff driver (``diff.ckpt.textconv``), one line per tensor."""

from __future__ import annotations

from pathlib import Path

import click

from guard.cli.review import run_textconv


@click.command("textconv", short_help="Print a weight file as text for `git diff` (one line per tensor).")
@click.argument("file", type=click.Path(path_type=Path))
def textconv(file: Path) -> int:
    """Print FILE's tensors, one `name DTYPE [shape]` line each, sorted by name.

    \b
    Set up once per repository:
      echo '*.safetensors diff=ckpt' >> .gitattributes
      git config diff.ckpt.textconv "ckpt-guard textconv"
    """
    return run_textconv(file)
