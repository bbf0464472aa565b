"""The README is tested: every rule, output format and exit code in it, generated from the catalogue."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from guard.catalogue import RULES
from guard.cli import main
from guard.reporters import REPORTERS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_codes_are_unique_sorted_and_well_formed() -> None:
    codes = [r.code for r in RULES]
    assert codes == sorted(set(codes))
    assert all(re.fullmatch(r"CG\d{3}", c) for c in codes)
    assert len({r.name for r in RULES}) == len(RULES)


def test_readme_rule_table_is_the_generated_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "--format", "markdown"]) == 0
    table = capsys.readouterr().out.strip()
    assert table in README, "regenerate the README table with `ckpt-guard rules --format markdown`"


@pytest.mark.parametrize("fmt", sorted(REPORTERS))
def test_readme_lists_every_output_format(fmt: str) -> None:
    assert f"| `{fmt}` |" in README


@pytest.mark.parametrize("code", ["0", "1", "2"])
def test_readme_lists_every_exit_code(code: str) -> None:
    assert f"| {code} |" in README


def test_readme_shows_the_two_commands_first() -> None:
    assert README.index("make demo") < README.index("## Usage")
    assert README.index("make test") < README.index("## Usage")
