"""What `diff` and `textconv` do once their flags are parsed, and their flags as one table: no click.

git runs the textconv driver once per file and side of every `git diff` and `git log -p`, and a
diff's header work costs about what scanning both sides does: click's import would be a third of
either.  ``guard.cli.main`` parses their plain spellings with ``flags.parse_plain`` and calls these;
anything else (--help, a typo) goes to the click commands in ``guard.cli.diff`` and
``guard.cli.textconv``, which are built from the same table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from guard.cli.flags import POLICY_FLAGS, Flag
from guard.diff.render import VIEWS
from guard.errors import UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: git's textconv driver imports none
if TYPE_CHECKING:
    from collections.abc import Callable

    from typing_extensions import Unpack  # typing's from 3.11

    from guard.cli.run import PolicyFlags
    from guard.diff.change import ChangeReport

DIFF_FORMATS = tuple(VIEWS)  # the diff views' table, in its order
DIFF_FLAGS: tuple[Flag, ...] = (
    *POLICY_FLAGS,
    Flag(("--format", "-f"), "fmt", "value", "Output format.", choices=DIFF_FORMATS, default="text"),
    Flag(("--output", "-o"), "output", "value", "Write the result to FILE instead of stdout.", path=True),
    Flag(("--values",), "values", "flag",
         "Also compare tensor data (streamed; needs numpy): max abs and rel difference per changed tensor."),
    Flag(("--no-summary",), "no_summary", "flag", "Do not append to $GITHUB_STEP_SUMMARY."),
)


def run_diff(old: Path, new: Path, *, fmt: str, output: Path | None, values: bool, no_summary: bool,
             **policy_flags: Unpack[PolicyFlags]) -> int:
    from guard.cli.run import resolve_policy, write_rendered
    from guard.diff import compare_sides, local_side, render_change

    policy = resolve_policy(**policy_flags)
    change = compare_sides(local_side(old), local_side(new), policy, values=values)
    write_rendered(lambda as_fmt, color=False: render_change(change, as_fmt, color=color), fmt, output,
                   summary=None if no_summary else lambda: _markdown(change))
    return change.exit_code


def _markdown(change: ChangeReport) -> str:
    from guard.diff import render_change_markdown

    return render_change_markdown(change)


def run_textconv(file: Path) -> int:
    from guard.diff.textconv import textconv_lines

    if not file.is_file():
        raise UsageError(f"{file}: no such file")
    sys.stdout.write("\n".join(textconv_lines(file)) + "\n")
    sys.stdout.flush()
    return 0


def plain_review(args: list[str]) -> Callable[[], int] | None:
    """A call of `diff OLD NEW [flags]` or `textconv FILE` in plain spellings, ready to run; else None."""
    if args[:1] == ["textconv"] and len(args) == 2 and not args[1].startswith("-"):
        return lambda: run_textconv(Path(args[1]))
    if args[:1] != ["diff"]:
        return None
    from guard.cli.flags import parse_plain

    parsed = parse_plain(args[1:], DIFF_FLAGS)
    if parsed is None or len(parsed[1]) != 2:
        return None  # click's to parse and to explain
    options, (old, new) = parsed
    return lambda: run_diff(Path(old), Path(new), **options)  # type: ignore[arg-type]  # the parsed options, of run_diff's types
