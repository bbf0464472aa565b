"""`ckpt-guard hub ...`.  (Being written with the Hub issue.)"""

from __future__ import annotations

import click


@click.group()
def hub() -> None:
    """Scan Hub repositories remotely, gate uploads, review pushes."""
