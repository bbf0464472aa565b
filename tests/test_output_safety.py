"""Attacker-controlled strings stay inert and bounded in every output format.

A real safetensors file (and its directory name) carries hostile tensor names and
``__metadata__`` values: newlines, workflow commands, ANSI escapes, BIDI
overrides, markdown/HTML and a 1 MB name.  Each reporter renders a real scan of it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from guard.config import build_policy  # noqa: E402
from guard.report import Report  # noqa: E402
from guard.reporters import REPORTERS, render  # noqa: E402
from guard.scan import scan_paths  # noqa: E402

BIG = "A" * (1 << 20)
HOSTILE = [
    "evil\n::error file=x.py,line=1::PWNED newline",
    "cr\r::warning::PWNED carriage return",
    "%0A::error::PWNED pre-escaped",
    "##[error]PWNED legacy command",
    "\x1b[31mred\x1b[0m\x1b]8;;http://x\x07link",
    "bidi\u202eexe.txt\u2066x\u2069",
    "<img src=x onerror=alert(1)>|**bold**|`code`",
    "</td></tr><script>PWNED</script>",
    "[link](javascript:alert(1)) ![i](http://x/i.png)",
    "tab\tnul\x00del\x7fc1\x85",
    "::stop-commands::PWNEDTOKEN",
]
METADATA = {"format": "pt", "note": "\n::error::PWNED metadata\x1b[31m", "html": "<script>PWNED</script>"}
BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")


def _hostile_model(root: Path, names: list[str], *, dirname: str = "m\n::error::PWNED dir") -> Path:
    directory = root / dirname
    directory.mkdir()
    # one fp16 tensor per name: CG101 (expected fp32) and CG102 (mixed) name them
    tensors = {name: torch.zeros(2, dtype=torch.float16) for name in names}
    tensors["ok.weight"] = torch.zeros(2)
    safetensors_torch.save_file(tensors, directory / "model.safetensors", metadata=METADATA)
    return directory


def _report(directory: Path) -> Report:
    return scan_paths([directory], build_policy({}, source=None, overrides={"expect": "fp32"}))


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    report = _report(_hostile_model(tmp_path_factory.mktemp("hostile"), HOSTILE))
    assert report.findings, "the hostile model must produce findings that name its tensors"
    return report


def _runner_commands(output: str) -> list[str]:
    """Lines the Actions runner treats as commands: '::cmd ...::' (v2) or '##[cmd]' (v1)."""
    return [line for line in output.split("\n") if line.lstrip().startswith(("::", "##["))]


def test_reporters_cover_every_format() -> None:
    assert set(REPORTERS) == {"text", "json", "sarif", "github", "markdown"}


def test_text_has_no_control_bytes(hostile_report: Report) -> None:
    out = render(hostile_report, "text")
    assert "\x1b" not in out and "\r" not in out and "\x00" not in out and "\x85" not in out
    assert not BIDI.search(out)
    assert not _runner_commands(out)
    assert not any(line.startswith("PWNED") for line in out.splitlines())


def test_github_emits_one_command_per_annotation(hostile_report: Report) -> None:
    out = render(hostile_report, "github")
    commands = _runner_commands(out)
    shown = min(len(hostile_report.findings), 30)
    assert len(commands) in (shown, shown + 1)  # + the "more findings" notice
    for line in commands:
        match = re.fullmatch(r"::(error|warning|notice) ([^:]*)::(.*)", line)
        assert match, line  # the hostile text never opens a second "::" section or a new line
        keys = [prop.split("=", 1)[0] for prop in match.group(2).split(",")]
        assert set(keys) <= {"file", "line", "title"}, line  # escaped: no forged property
    assert "\r" not in out and "::stop-commands::" not in out.replace("%3A%3Astop", "")


def test_github_messages_round_trip_through_the_runner_unescape(hostile_report: Report) -> None:
    out = render(hostile_report, "github")
    messages = [re.fullmatch(r"::\w+ [^:]*::(.*)", line).group(1) for line in _runner_commands(out)]  # type: ignore[union-attr]
    unescaped = [m.replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%") for m in messages]
    # what the annotation shows is the finding's own message, nothing more
    assert set(unescaped) <= {f"{f.code}: {f.message}" for f in hostile_report.findings} | {
        u for u in unescaped if "more finding" in u}


def test_markdown_has_no_html_and_no_broken_rows(hostile_report: Report) -> None:
    out = render(hostile_report, "markdown")
    assert "<" not in out and "\x1b" not in out and "\r" not in out and not BIDI.search(out)
    assert "](" not in out, "a hostile name became a link or an image"
    section = out.split("### Findings", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(hostile_report.findings)  # header, rule, one row per finding
    for row in rows:
        assert len(re.findall(r"(?<!\\)\|", row)) == 6, row  # five cells, no cell breaks


def test_json_round_trips_identically(hostile_report: Report) -> None:
    out = render(hostile_report, "json")
    assert out.isascii()
    again = Report.from_json(json.loads(out))
    assert again.findings == hostile_report.findings
    assert {f.tensor for f in again.findings} - {None} <= set(HOSTILE) | {"ok.weight"}


def test_sarif_parses_and_keeps_names_as_data(hostile_report: Report) -> None:
    out = render(hostile_report, "sarif")
    assert out.isascii()
    log = json.loads(out)
    results = log["runs"][0]["results"]
    assert len(results) == len(hostile_report.findings)
    for result in results:
        assert "markdown" not in result["message"]  # plain text only: never rendered as markup


@pytest.mark.parametrize("fmt", sorted(REPORTERS))
def test_metadata_values_never_reach_an_output(hostile_report: Report, fmt: str) -> None:
    assert "PWNED metadata" not in render(hostile_report, fmt)


# ------------------------------------------------------------------ bounded

@pytest.fixture(scope="module")
def size_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Report]:
    small = _report(_hostile_model(tmp_path_factory.mktemp("small"), ["B" * 1024], dirname="m"))
    big = _report(_hostile_model(tmp_path_factory.mktemp("big"), [BIG], dirname="m"))
    return small, big


# JSON and SARIF are lossless: each finding may carry the name once, as its tensor field;
# no message may copy it, and the human views may not carry it at all.
LOSSLESS = ("json", "sarif")


@pytest.mark.parametrize("fmt", sorted(REPORTERS))
def test_a_1mb_name_does_not_make_a_multi_mb_report(size_pair: tuple[Report, Report], fmt: str) -> None:
    small, big = (render(r, fmt) for r in size_pair)
    growth = len(big) - len(small)
    as_data = sum(f.tensor == BIG for f in size_pair[1].findings) if fmt in LOSSLESS else 0
    allowed = as_data * len(BIG) + 64 * 1024
    assert growth < allowed, (
        f"{fmt}: a {len(BIG):,}-char tensor name grew the report by {growth:,} bytes "
        f"(allowed {allowed:,}): the name is copied about {round(growth / len(BIG))} time(s), "
        f"{as_data} of them as a finding's tensor field"
    )
