"""One error base for the tool's own failures.

A problem *in a checkpoint* is a Finding, never an exception; these are for
usage, configuration, I/O and network failures.  Only ``guard.cli`` catches
``GuardError``: it prints one line and exits 2.
"""

from __future__ import annotations


class GuardError(Exception):
    """The tool could not do what was asked (exit code 2)."""


class UsageError(GuardError, ValueError):
    """Bad flag, bad argument combination, bad path."""


class ConfigError(GuardError, ValueError):
    """Bad ``[tool.ckpt-guard]`` / ``.ckpt-guard.toml`` configuration."""


class MissingExtraError(GuardError, ImportError):
    """An optional dependency is not installed; the message names the extra."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"{module} is not installed; install it with: pip install 'ckpt-guard[{extra}]'"
        )


class MalformedCheckpoint(ValueError):
    """Raised by a reader for a file it cannot parse; turned into CG001 by the dispatcher.

    Not a GuardError: it never reaches the user as an exception.
    """
