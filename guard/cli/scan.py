"""`ckpt-guard scan PATHS`: the header scan, the hot path of the hook and the Action."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from guard.cli.flags import SCAN_FLAGS
from guard.cli.options import click_option
from guard.cli.run import run_scan


def _scan(paths: tuple[Path, ...], **flags: Any) -> int:
    """Scan checkpoint files and model directories (default: the current directory)."""
    return run_scan(paths, **flags)


_command: Any = click.argument("paths", nargs=-1, type=click.Path(path_type=Path))(_scan)
for _flag in reversed(SCAN_FLAGS):
    _command = click_option(_flag)(_command)
scan = click.command("scan", short_help="Scan checkpoints and model directories.")(_command)
