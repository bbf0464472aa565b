"""What the commands share, as click options: built from the one flag table in ``guard.cli.flags``.

Imports no command; ``emit`` and ``resolve_policy`` live in ``guard.cli.run`` (no click) and are
re-exported here for the command modules.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from guard.cli.flags import OUTPUT_FLAGS, POLICY_FLAGS, Flag
from guard.cli.run import emit, resolve_policy

__all__ = ["emit", "output_options", "policy_options", "resolve_policy", "click_option"]


def click_option(flag: Flag) -> Callable[[Any], Any]:
    kwargs: dict[str, Any] = {"help": flag.help}
    if flag.metavar:
        kwargs["metavar"] = flag.metavar
    if flag.kind == "multiple":
        kwargs["multiple"] = True
    elif flag.kind == "flag":
        kwargs["is_flag"] = True
    if flag.choices is not None:
        kwargs["type"] = click.Choice(flag.choices)
    if flag.path:
        kwargs["type"] = click.Path(dir_okay=False, path_type=Path)
    if flag.default is not None:
        kwargs["default"], kwargs["show_default"] = flag.default, True
    return click.option(*flag.names, flag.dest, **kwargs)


def _apply(flags: tuple[Flag, ...], func: Any) -> Any:
    for flag in reversed(flags):
        func = click_option(flag)(func)
    return func


def policy_options(func: Any) -> Any:
    """The policy flags shared by `scan`, `hub scan` and `hub upload`."""
    return _apply(POLICY_FLAGS, func)


def output_options(func: Any) -> Any:
    return _apply(OUTPUT_FLAGS, func)
