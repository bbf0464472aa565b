"""The click root group: every command, loaded on first use, listed by `--help`."""

from __future__ import annotations

from typing import Any

import click

from guard import __version__, lazy
from guard.errors import GuardError

# name -> ("module:attribute" of its click command, short help); the short help is here so `--help` loads
# no command.
COMMANDS: dict[str, tuple[str, str]] = {
    "scan": ("guard.cli.scan:scan", "Scan checkpoints and model directories."),
    "rules": ("guard.cli.rules:rules", "List the rules, or explain one."),
    "report": ("guard.cli.report:report_cmd", "Render a saved JSON result in another format."),
    "fix": ("guard.cli.fix:fix", "Plan and apply mechanical fixes of findings (dry run by default)."),
    "diff": ("guard.cli.diff:diff", "What a change did: tensors, dtypes, sizes, findings."),
    "textconv": ("guard.cli.textconv:textconv", "Print a weight file as text for `git diff` (one line per tensor)."),
    "convert": ("guard.cli.convert:convert", "Convert between PyTorch and Flax, bit-exactly."),
    "parity": ("guard.cli.parity:parity", "Compare PyTorch and Flax outputs of one model."),
    "hub": ("guard.cli.hub:hub", "Scan Hub repositories remotely, gate uploads, review pushes."),
    "env": ("guard.cli.env:env", "Install, list and remove the environments targets run in."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use."""

    def __init__(self, *args: Any, commands: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # click.Group's own arguments, passed through
        self.lazy = commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.lazy)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return None
        command: click.Command = lazy.resolve(self.lazy[cmd_name][0])
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, help_) in self.lazy.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, commands=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ckpt-guard")
def cli() -> None:
    """Check model checkpoints for dtype problems before they land."""


def run(args: list[str]) -> int:
    try:
        result = cli.main(args=args, prog_name="ckpt-guard", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("ckpt-guard: interrupted", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return 2
    except GuardError as exc:
        click.echo(f"ckpt-guard: error: {exc}", err=True)
        return 2
    except KeyboardInterrupt:
        click.echo("ckpt-guard: interrupted", err=True)
        return 130
    return result if isinstance(result, int) else 0
