"""The text files a plan writes, as a `git apply`-ready unified diff.

Text fixes (config.json, index files) are cheap to stage, so the patch is what the actions
themselves write: each is staged into a temporary directory outside the tree (a dry run
changes nothing there) and compared with the file it would replace.  The patch holds the
files' own bytes: names in it are escaped only as the JSON in those files escapes them.
"""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
from pathlib import Path

from guard.config import Policy
from guard.errors import GuardError
from guard.fix.actions import stage
from guard.fix.context import ActionContext, FixOptions
from guard.fix.plan import PlannedFix

TEXT_SUFFIXES = (".json",)
MAX_TEXT_BYTES = 64 * 1024 * 1024

TextChange = tuple[str, "bytes | None", bytes]  # (path relative to the working directory, old or None, new)


def is_text_fix(planned: PlannedFix) -> bool:
    return bool(planned.fix.writes) and all(w.endswith(TEXT_SUFFIXES) for w in planned.fix.writes)


def preview_text_changes(planned: PlannedFix, options: FixOptions, policy: Policy, *,
                         root: Path = Path(".")) -> list[TextChange]:
    """What a text-only fix would write, staged outside the tree; [] when it cannot be staged."""
    model_dir = root / str(planned.fix.arguments.get("dir", "."))
    staging = Path(tempfile.mkdtemp(prefix="ckpt-guard-preview-"))
    try:
        staged = stage(planned.fix, ActionContext(model_dir, staging, options, policy))
        changes = []
        for source, final in staged.files:
            new = Path(source).read_bytes()
            old = Path(final).read_bytes() if Path(final).is_file() else None
            if new != old:
                changes.append((relative_to_cwd(Path(final)), old, new))
        return changes
    except (GuardError, OSError, ValueError):
        return []  # the fix would be refused when applied too; the plan says why then
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def unified_patch(changes: list[TextChange]) -> str:
    """One diff for all the changes: a/ and b/ prefixes, /dev/null for a new file."""
    out: list[str] = []
    for path, old, new in changes:
        before = _lines(old)
        after = _lines(new)
        header = (f"a/{path}" if old is not None else "/dev/null", f"b/{path}")
        out.append(f"diff --git a/{path} b/{path}\n")
        if old is None:
            out.append("new file mode 100644\n")
        for line in difflib.unified_diff(before, after, *header, n=3):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _lines(data: bytes | None) -> list[str]:
    if data is None:
        return []
    # surrogateescape keeps any byte as it is: the patch is the file's own bytes
    return data.decode("utf-8", "surrogateescape").splitlines(keepends=True)


def relative_to_cwd(path: Path) -> str:
    return Path(os.path.relpath(path)).as_posix()


def write_patch(path: Path, text: str) -> None:
    from guard.atomic import write_bytes_atomic

    write_bytes_atomic(path, text.encode("utf-8", "surrogateescape"))
