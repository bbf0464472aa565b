"""The git diff driver's text: one weight file as one line per tensor, sorted by name.

``git diff`` compares these texts line by line, so a tensor that kept its name, dtype and shape
prints the same line on both sides and drops out; a recast or reshaped tensor is one ``-`` and one
``+`` line.  Only what the file says of its tensors is printed (no sizes, no offsets, no counts),
so a re-save that moved bytes around shows nothing.  Names are escaped (``inert_text``): a name
holding a newline would otherwise forge a line of the diff.
"""

from __future__ import annotations

import re
from pathlib import Path

from guard.inventory import scan_local_file
from guard.reporters.inert import inert_text
from guard.tensors import FileScan

NAME_LIMIT = 1000  # characters of one name; longer ones are cut and say how much
_OID = re.compile(rb"^oid sha256:([0-9a-f]{64})$", re.M)
_SIZE = re.compile(rb"^size (\d+)$", re.M)


def textconv_lines(path: Path) -> list[str]:
    scan = scan_local_file(path)
    if scan.format == "lfs-pointer":
        return [lfs_line(path)]
    if scan.format is None:
        reason = next((f.message for f in scan.findings), "no reader handles this file")
        return [f"# ckpt-guard: unreadable: {inert_text(reason, limit=300)}"]
    return [f"# ckpt-guard textconv: {inert_text(scan.format, limit=40)}", *tensor_lines(scan)]


def tensor_lines(scan: FileScan) -> list[str]:
    rows = sorted((t.name, t.dtype, t.shape) for t in scan.tensors)
    return [f"{inert_text(name, limit=NAME_LIMIT)} {inert_text(dtype, limit=40)} [{', '.join(map(str, shape))}]"
            for name, dtype, shape in rows]


def lfs_line(path: Path) -> str:
    with open(path, "rb") as fh:
        head = fh.read(1024)
    oid, size = _OID.search(head), _SIZE.search(head)
    what = ", ".join(x for x in (f"oid sha256:{oid.group(1).decode()}" if oid else "",
                                 f"{int(size.group(1)):,} bytes" if size else "") if x)
    return (f"# ckpt-guard: Git LFS pointer, not smudged ({what or 'no oid'}): "
            "run `git lfs pull` (or install git-lfs) to see its tensors")
