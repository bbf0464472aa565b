"""`ckpt-guard parity`.  (Being written with the conversion issue.)"""

from __future__ import annotations

import click

from guard.errors import UsageError


@click.command()
@click.argument("torch_dir")
@click.argument("flax_dir")
def parity(torch_dir: str, flax_dir: str) -> int:
    """Compare PyTorch and Flax outputs of the same model."""
    raise UsageError("parity is not available yet")
