"""`ckpt-guard convert`.  (Being written with the conversion issue.)"""

from __future__ import annotations

import click

from guard.errors import UsageError


@click.command()
@click.argument("src")
def convert(src: str) -> int:
    """Convert a model between PyTorch and Flax, bit-exactly."""
    raise UsageError("convert is not available yet")
