"""Every pointer the tool shows resolves for a pip user: a wheel has no docs/, bench/ or tests/, so
``--help``, messages, findings and reports name the repository's pages by URL, and each page exists."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

import guard
from guard import DOCS_URL
from guard.cli.root import cli

ROOT = Path(__file__).resolve().parent.parent
# a path of the repository's own, not preceded by a URL's or a longer path's characters
RELATIVE = re.compile(r"(?<![\w./-])(?:docs|bench|tests|scripts|fuzz)/[\w.-]+")
URL = re.compile(re.escape(DOCS_URL) + r"([\w.-]+)")


def _texts_shown() -> Iterator[tuple[str, str]]:
    """Every string constant of the package that is not a docstring (what code may show or write)."""
    for path in sorted((ROOT / "guard").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                yield f"{path.relative_to(ROOT)}:{node.lineno}", node.value


def _help_pages() -> Iterator[tuple[str, str]]:
    """``--help`` of every command and subcommand, as click renders it."""
    def walk(command: click.Command, ctx: click.Context) -> Iterator[tuple[str, str]]:
        yield ctx.command_path, command.get_help(ctx)
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                yield from walk(sub, click.Context(sub, info_name=name, parent=ctx))

    yield from walk(cli, click.Context(cli, info_name="ckpt-guard"))


def test_the_package_shows_no_path_a_pip_user_lacks() -> None:
    relative = [(where, m.group()) for where, text in _texts_shown() for m in RELATIVE.finditer(text)]
    assert relative == [], "point to the repository's page instead: guard.DOCS_URL + NAME"


def test_help_shows_no_path_a_pip_user_lacks_and_its_pages_exist() -> None:
    pages = dict(_help_pages())
    assert {"ckpt-guard", "ckpt-guard scan", "ckpt-guard parity", "ckpt-guard env install"} <= set(pages)
    assert [(cmd, m.group()) for cmd, text in pages.items() for m in RELATIVE.finditer(text)] == []
    named = {m.group(1) for text in pages.values() for m in URL.finditer(text)}
    assert "jax.md" in named  # parity --against points there, on one line: click breaks a URL at its hyphens
    assert [name for name in named if not (ROOT / "docs" / name).is_file()] == []


def test_every_docs_url_in_the_package_names_a_page_that_exists() -> None:
    named = {m.group(1) for _where, text in _texts_shown() for m in URL.finditer(text)}
    sources = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "guard").rglob("*.py"))
    named |= set(re.findall(r"\{DOCS_URL\}([\w.-]+\.md)", sources))  # the f-strings' tails
    assert named and [name for name in named if not (ROOT / "docs" / name).is_file()] == []


def test_the_pointers_once_relative_are_urls(capsys: pytest.CaptureFixture[str]) -> None:
    from guard.cli import main
    from guard.parity.relative import SOURCE

    assert main(["parity", "--help"]) == 0
    assert f"{DOCS_URL}jax.md\n" in capsys.readouterr().out  # whole, on a line of its own
    assert f"{DOCS_URL}parity.md" in SOURCE  # a low-precision verdict's source, in the parity report
    assert DOCS_URL.startswith("https://github.com/") and guard.DOCS_URL.endswith("/docs/")
