"""The scan's flags as one literal table, and a parser for their plain spellings.

click builds `scan`, `hub scan` and `hub upload` from these rows (``guard.cli.options``).
A pre-commit hook runs `ckpt-guard scan` hundreds of times a day and importing
click costs about what the whole of ``check-added-large-files`` does, so the
hook's own spellings (`--long value`, `--long=value`, `-f value`, flags, paths)
are parsed here without it.  Anything else (`--help`, a typo, a bundled short
option, a bad choice) returns None and click parses it, with its own messages.
This module imports nothing but the standard library and the tables it reads (``guard.reporters.REPORTERS``
for the output formats: a scan renders through it anyway).
"""

from __future__ import annotations

import os

from guard.records import Record
from guard.reporters import REPORTERS

FAIL_ON = ("error", "warning", "note", "never")
FORMATS = tuple(REPORTERS)  # the output formats: the reporters' table, in its order


class Flag(Record):
    names: tuple[str, ...]
    dest: str
    kind: str  # "value" | "multiple" | "flag"
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    path: bool = False  # a file path (click.Path(dir_okay=False))
    default: object = None


POLICY_FLAGS: tuple[Flag, ...] = (
    Flag(("--expect",), "expect", "value",
         "Expected floating dtype: fp32 (default), bf16, fp16, uniform, or config.", "DTYPE|uniform|config"),
    Flag(("--keep-fp32",), "keep_fp32", "multiple",
         "Tensor-name glob that may stay fp32 under a lower --expect (repeatable; added to the default norm "
         "patterns).", "PATTERN"),
    Flag(("--target",), "targets", "multiple",
         "Conversion target: torch, flax, jax, numpy, optionally with a cast dtype (torch:fp16). Repeatable; "
         "default torch and flax.", "FRAMEWORK[:DTYPE]"),
    Flag(("--select",), "select", "multiple", "Rule code prefixes to enable.", "CODES"),
    Flag(("--extend-select",), "extend_select", "multiple", "Add to the selection.", "CODES"),
    Flag(("--ignore",), "ignore", "multiple", "Rule code prefixes to disable.", "CODES"),
    Flag(("--fail-on",), "fail_on", "value", "Lowest severity that fails the run (default: error).",
         choices=FAIL_ON),
    Flag(("--config",), "config_file", "value",
         "Config file (default: nearest .ckpt-guard.toml or pyproject.toml).", path=True),
)
OUTPUT_FLAGS: tuple[Flag, ...] = (
    Flag(("--format", "-f"), "fmt", "value", "Output format.", choices=FORMATS, default="text"),
    Flag(("--output", "-o"), "output", "value", "Write the report to FILE instead of stdout.", path=True),
)
SCAN_FLAGS: tuple[Flag, ...] = (
    *POLICY_FLAGS, *OUTPUT_FLAGS,
    Flag(("--values",), "values", "flag", "Also read tensor data (CG201-CG204); needs numpy."),
    Flag(("--no-summary",), "no_summary", "flag", "Do not append to $GITHUB_STEP_SUMMARY."),
)


def defaults(flags: tuple[Flag, ...]) -> dict[str, object]:
    return {f.dest: () if f.kind == "multiple" else False if f.kind == "flag" else f.default for f in flags}


def parse_plain(args: list[str], flags: tuple[Flag, ...]) -> tuple[dict[str, object], list[str]] | None:
    """(options, positionals) for the plain spellings, exactly as click reads them; None for anything else."""
    by_name = {name: flag for flag in flags for name in flag.names}
    values = defaults(flags)
    positionals: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            positionals.extend(args[i:])
            break
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            continue
        name, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        flag = by_name.get(name)
        if flag is None or (flag.kind == "flag" and eq):
            return None  # unknown, bundled or odd: click's to parse and to explain
        if flag.kind == "flag":
            values[flag.dest] = True
            continue
        if not eq:
            if i >= len(args) or args[i].startswith("-"):
                return None
            inline, i = args[i], i + 1
        if flag.choices is not None and inline not in flag.choices:
            return None
        if flag.path and os.path.isdir(inline):
            return None  # click refuses a directory here, with its message
        value: object = inline
        if flag.path:
            from pathlib import Path  # a config file or an output file: not on the plain hook's line

            value = Path(inline)
        if flag.kind == "multiple":
            values[flag.dest] = (*values[flag.dest], value)  # type: ignore[misc]  # a multiple flag's value is a tuple, started empty
        else:
            values[flag.dest] = value
    return values, positionals
