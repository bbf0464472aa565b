"""Lines of code per package of guard/, in the working tree or at a git revision (docs/benchmarks.md).

    python scripts/loc.py [--rev REV] [--markdown]

A package is guard/'s first-level folder (``readers``, ``rules``, ...); guard/'s own modules count as ``guard``.
``lines`` counts every line; ``code`` leaves out blank lines and lines that hold only a comment.
"""

from __future__ import annotations

import argparse
import subprocess
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sources(rev: str | None) -> Iterator[tuple[str, str]]:
    """(path, text) of every guard/**/*.py, at ``rev`` or in the working tree."""
    if rev is None:
        for path in sorted((ROOT / "guard").rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")
        return
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev, "guard"],
                            capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        if name.endswith(".py"):
            yield name, subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{name}"], capture_output=True,
                                       text=True, check=True).stdout


def package(path: str) -> str:
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else "guard"


def count(rev: str | None) -> tuple[Counter[str], Counter[str], Counter[str]]:
    lines: Counter[str] = Counter()
    code: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    for path, text in sources(rev):
        name = package(path)
        modules[name] += 1
        for line in text.splitlines():
            lines[name] += 1
            stripped = line.strip()
            if stripped and not stripped.startswith("#"):
                code[name] += 1
    return lines, code, modules


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="a git revision (default: the working tree)")
    parser.add_argument("--markdown", action="store_true", help="a table for docs/benchmarks.md")
    args = parser.parse_args(argv)
    lines, code, modules = count(args.rev)
    rows = sorted(lines, key=lambda name: -lines[name])
    if args.markdown:
        print("| package | modules | lines | code |\n|---|---:|---:|---:|")
        for name in rows:
            print(f"| `{name}` | {modules[name]} | {lines[name]:,} | {code[name]:,} |")
        print(f"| all | {sum(modules.values())} | {sum(lines.values()):,} | {sum(code.values()):,} |")
        return 0
    for name in rows:
        print(f"{name:<12} {modules[name]:>4} modules {lines[name]:>7,} lines {code[name]:>7,} code")
    total = (sum(modules.values()), sum(lines.values()), sum(code.values()))
    print(f"{'all':<12} {total[0]:>4} modules {total[1]:>7,} lines {total[2]:>7,} code")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
