"""`ckpt-guard diff OLD NEW`: what a change did to the weights, and the findings it introduces.

The flags are ``guard.cli.review.DIFF_FLAGS``; plain spellings never reach click (``guard.cli.main``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from guard.cli.options import click_option
from guard.cli.review import DIFF_FLAGS, run_diff


def _diff(old: Path, new: Path, **flags: Any) -> int:
    """Compare OLD and NEW (two weight files, or two model directories), each scanned under one policy.

    Exit 0 when the change introduces no finding at or above --fail-on, 1 when it does, 2 for a usage error.
    """
    return run_diff(old, new, **flags)


_command: Any = click.argument("new", type=click.Path(path_type=Path))(_diff)
_command = click.argument("old", type=click.Path(path_type=Path))(_command)
for _flag in reversed(DIFF_FLAGS):
    _command = click_option(_flag)(_command)
diff = click.command("diff", short_help="What a change did: tensors, dtypes, sizes, findings.")(
    _command)
