"""`ckpt-guard env install|list|remove|python`: the environments targets run in when they cannot run here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from guard.envs.registry import ENVIRONMENTS
from guard.errors import UsageError

NAMES = click.Choice(tuple(ENVIRONMENTS))


@click.group(short_help="Install, list and remove the environments targets run in.")
def env() -> None:
    """The environments targets run in when their pins clash with ckpt-guard's own (parity's transformers-4
    Flax side, tunix, keras-hub, EasyDeL, MaxText): built on request into ckpt-guard's cache directory
    ($CKPT_GUARD_HOME, else the user's cache directory) from the constraints the tool was tested with."""


@env.command("install", short_help="Build environments (a no-op for one already built).")
@click.argument("names", nargs=-1, required=True, type=NAMES)
def install(names: tuple[str, ...]) -> int:
    """Build the named environments: uv where it is on PATH, else venv + pip; kept until `env remove`."""
    from guard.envs.build import install as build

    for name in dict.fromkeys(names):
        build(ENVIRONMENTS[name], say=lambda line: click.echo(f"ckpt-guard: env: {line}", err=True))
    return 0


@env.command("list", short_help="Where each environment would run from, and whether it is ready.")
@click.option("--format", "-f", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True)
def list_(fmt: str) -> int:
    """Each environment: where a target would run (this process, a named Python, the managed folder, or
    missing), whether it is ready, its library's version, its size on disk and how many distributions its
    install added (the rest are this Python's, for an overlay)."""
    rows = [_where(name) for name in ENVIRONMENTS]
    if fmt == "json":
        click.echo(json.dumps(rows, indent=1))
        return 0
    from guard.envs.home import envs_home

    click.echo(f"managed environments: {envs_home()}")
    width = max(len(n) for n in ("NAME", *ENVIRONMENTS))
    click.echo(f"{'NAME':<{width}}  {'STATE':<7}  {'VERSION':<10}  {'SIZE':>9}  {'INSTALLED':>9}  WHERE")
    for row in rows:
        size = f"{int(str(row['size'])) / 1e6:,.0f} MB" if row.get("size") else "-"
        added = row.get("installed")
        installed = str(len(added)) if isinstance(added, dict) else "-"
        state = "ready" if row["ready"] else "missing"
        click.echo(f"{row['name']:<{width}}  {state:<7}  {row['version'] or '-':<10}  {size:>9}  {installed:>9}  "
                   f"{row['where']}" + (f"  ({row['note']})" if row.get("note") else ""))
    return 0


@env.command("remove", short_help="Delete managed environments.")
@click.argument("names", nargs=-1, required=True, type=NAMES)
def remove(names: tuple[str, ...]) -> int:
    from guard.envs.build import remove as delete

    for name in dict.fromkeys(names):
        gone = delete(ENVIRONMENTS[name])
        click.echo(f"ckpt-guard: env: {name}: " + (f"removed {', '.join(str(p) for p in gone)}" if gone else
                                                   "nothing to remove"), err=True)
    return 0


@env.command("python", short_help="Print the Python a managed environment runs with.")
@click.argument("name", type=NAMES)
def python(name: str) -> int:
    """The managed environment's interpreter (for a "lib" environment, its folder), for scripts and make."""
    from guard.envs.find import find_managed, install_hint

    found = find_managed(ENVIRONMENTS[name])
    if found is None:
        raise UsageError(f"{name} is not installed: {install_hint(name)}")
    click.echo(str(found.path[0] if found.path else found.python))
    return 0


def _where(name: str) -> dict[str, object]:
    from guard.envs.find import find, find_managed, variable_of
    from guard.envs.home import managed_dir, read_stamp, size_on_disk

    env = ENVIRONMENTS[name]
    row: dict[str, object] = {"name": name, "ready": False, "version": None, "where": "missing", "size": None,
                              "installed": None}
    try:
        found = find(name)
    except UsageError as exc:
        if os.environ.get(variable_of(name)):
            row["note"] = str(exc)
        managed = managed_dir(env)
        row["where"] = f"missing (would be {managed}: ckpt-guard env install {name})"
        return row
    row.update(ready=True, version=found.version, where=found.where)
    if found.where == "named":
        row["where"] = f"named: {found.label}"
    elif found.where == "managed":
        row["where"] = f"managed: {found.label}"
        row["size"] = size_on_disk(Path(found.label))
        installed = (read_stamp(Path(found.label)) or {}).get("installed")
        row["installed"] = installed if isinstance(installed, dict) else None
    else:
        row["where"] = f"this process ({found.python})"
    if found.warning:
        row["note"] = found.warning
    built = find_managed(env)
    if built is not None and found.where != "managed":
        row["managed"] = built.label
    return row
