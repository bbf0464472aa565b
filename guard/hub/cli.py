"""`ckpt-guard hub ...`: a group whose commands load on first use.

The commands reuse ``guard.cli``'s option decorators, and ``guard.cli`` imports
this group, so they live in ``guard.hub.commands`` and are imported only when a
hub command runs (which also keeps ``ckpt-guard scan`` free of them).
"""

from __future__ import annotations

import click

_NAMES = ("scan", "upload", "webhook")


class _HubGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_NAMES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _NAMES:
            return None
        from guard.hub.commands import COMMANDS

        return COMMANDS[cmd_name]


@click.group(cls=_HubGroup)
def hub() -> None:
    """Scan Hub repositories remotely, gate uploads, review pushes."""
