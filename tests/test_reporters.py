"""sarif / github / markdown views: schema-valid, injection-proof, capped, equal to a saved JSON's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
from safetensors.torch import save_file

from guard.catalogue import RULES
from guard.cli import main
from guard.findings import Finding, Severity
from guard.inventory import DtypeStats
from guard.report import FileSummary, ModelSummary, Report
from guard.reporters.github import PER_LEVEL, render_github
from guard.reporters.json_report import render_json
from guard.reporters.markdown import render_markdown
from guard.reporters.sarif import render_sarif

SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))
HOSTILE = "w\n::error file=x::pwned"
NASTY_NAMES = [
    HOSTILE,
    "w\r::warning::pwned\r\n::add-mask::secret",
    "a,b:c=d%0A%25::x",
    "<img src=x onerror=alert(1)>|**bold**|`code`&amp;[link](http://evil)",
    "Ünïcødé ✓ \u202egnp.exe",
]


# ------------------------------------------------------------------ the runner, as a parser


def _unescape_data(value: str) -> str:
    return value.replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%")


def _unescape_property(value: str) -> str:
    return _unescape_data(value).replace("%3A", ":").replace("%2C", ",")


def parse_commands(output: str) -> tuple[list[tuple[str, dict[str, str], str]], list[str]]:
    """Split output into lines as the runner reads them (CR, LF, CRLF) and parse `::cmd k=v::data`."""
    commands, plain = [], []
    for line in re.split(r"\r\n|\r|\n", output):
        stripped = line.lstrip()
        if not stripped.startswith("::"):
            plain.append(line)
            continue
        end = stripped.find("::", 2)
        assert end > 0, f"malformed command line: {line!r}"
        head, data = stripped[2:end], stripped[end + 2:]
        name, _, props_text = head.partition(" ")
        props = {}
        for prop in filter(None, props_text.split(",")):
            key, _, value = prop.partition("=")
            props[key.lower()] = _unescape_property(value)
        commands.append((name, props, _unescape_data(data)))
    return commands, plain


# ------------------------------------------------------------------ inputs


def _finding(i: int, severity: Severity = Severity.error, *, tensor: str | None = None) -> Finding:
    return Finding("CG101", severity, f"models/m{i % 7}/model-{i:05d}.safetensors",
                   f"tensor is F16, expected fp32 ({i})", tensor or f"layer.{i}.weight", None)


def _report(findings: list[Finding]) -> Report:
    model = ModelSummary("models/m0", (FileSummary("models/m0/model.safetensors", "safetensors", 10, 2),),
                         {"F16": DtypeStats(1, 16, 32), "F32": DtypeStats(1, 4, 16)})
    return Report(models=[model], findings=findings, policy={"fail_on": "error"})


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bad model, a good model and a config mismatch (a finding with a line), cwd = tmp_path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "good").mkdir()
    (tmp_path / "cfg").mkdir()
    save_file({name: torch.zeros(2, dtype=torch.float16) for name in NASTY_NAMES} | {"b": torch.zeros(2)},
              str(tmp_path / "bad" / "model.safetensors"))
    save_file({"w": torch.zeros(4, 4)}, str(tmp_path / "good" / "model.safetensors"))
    save_file({"w": torch.zeros(4, 4)}, str(tmp_path / "cfg" / "model.safetensors"))
    (tmp_path / "cfg" / "config.json").write_text('{\n  "model_type": "x",\n  "torch_dtype": "bfloat16"\n}\n')
    return tmp_path


def _scan(fmt: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["scan", ".", "--format", fmt, *extra])
    return code, capsys.readouterr().out


# ------------------------------------------------------------------ github


def test_github_one_command_per_finding_and_hostile_names_stay_inside(repo, capsys):
    code, out = _scan("github", capsys, "--expect", "fp32")
    assert code == 1
    commands, plain = parse_commands(out)
    code_json, raw = _scan("json", capsys)
    findings = json.loads(raw)["findings"]
    assert len(commands) == len(findings)
    assert all(name in ("error", "warning", "notice") for name, _, _ in commands)
    assert all(props["file"] in ("bad/model.safetensors", "cfg/config.json", "cfg/model.safetensors")
               for _, props, _ in commands), commands
    assert not any(props.get("file") == "x" for _, props, _ in commands)
    assert all(re.match(r"CG\d{3} ", props["title"]) for _, props, _ in commands)
    assert all(not line.lstrip().startswith("::") for line in plain)
    # the decoded message is the finding's own text, hostile bytes and all
    messages = {data for _, _, data in commands}
    assert {f"{f['code']}: {f['message']}" for f in findings} == messages


def test_github_line_only_where_the_finding_has_one(repo, capsys):
    _, out = _scan("github", capsys)
    commands, _ = parse_commands(out)
    config = [props for _, props, _ in commands if props["file"] == "cfg/config.json"]
    assert config and all(props["line"] == "3" for props in config)
    assert all("line" not in props for _, props, _ in commands if props["file"].endswith(".safetensors"))


@pytest.mark.parametrize("name", NASTY_NAMES)
def test_github_escaping_round_trips_through_the_runner_parser(name, monkeypatch):
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    path = f"dir,with:odd/{name.replace('/', '_')}.safetensors"
    finding = Finding("CG101", Severity.warning, path, f"msg {name}", name, None)
    commands, plain = parse_commands(render_github(_report([finding])))
    assert len(commands) == 1
    cmd, props, data = commands[0]
    assert cmd == "warning"
    assert props["file"] == finding.path
    assert data == f"CG101: msg {name}"


def test_github_caps_ten_per_level_most_severe_first_then_one_notice():
    findings = [_finding(i, [Severity.error, Severity.warning, Severity.note][i % 3]) for i in range(10_000)]
    report = _report(findings)
    commands, _ = parse_commands(render_github(report))
    names = [name for name, _, _ in commands]
    assert names.count("error") == PER_LEVEL and names.count("warning") == PER_LEVEL
    assert names.count("notice") == PER_LEVEL  # 9 findings + the overflow notice
    assert names == sorted(names, key=["error", "warning", "notice"].index)
    last = commands[-1]
    assert last[0] == "notice" and "more finding" in last[2] and "summary" in last[2]
    assert f"{10_000 - 29:,}" in last[2]
    # nothing is lost: the JSON has every finding
    assert len(json.loads(render_json(report))["findings"]) == 10_000


def test_github_no_overflow_notice_under_the_cap():
    commands, _ = parse_commands(render_github(_report([_finding(i, Severity.note) for i in range(10)])))
    assert [name for name, _, _ in commands] == ["notice"] * 10


def test_github_paths_relative_to_the_workspace(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    monkeypatch.chdir(tmp_path / "sub")
    commands, _ = parse_commands(render_github(_report([_finding(1)])))
    assert commands[0][1]["file"] == "sub/models/m1/model-00001.safetensors"


# ------------------------------------------------------------------ sarif


def test_sarif_validates_and_carries_every_rule(repo, capsys):
    code, out = _scan("sarif", capsys)
    assert code == 1
    log = json.loads(out)
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(log)
    assert len(log["runs"]) == 1
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [r.code for r in RULES]
    for rule in rules:
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"] and rule["help"]["text"]
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
        assert "security-severity" not in rule.get("properties", {})
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
        assert not location["artifactLocation"]["uri"].startswith(("/", "file:"))
        assert re.fullmatch(r"[0-9a-f]{16}:1", result["partialFingerprints"]["primaryLocationLineHash"])
        # weight files have no region: upload-sarif would otherwise hash the whole binary
        if location["artifactLocation"]["uri"].endswith(".safetensors"):
            assert "region" not in location
        else:
            assert location["region"]["startLine"] >= 1
    prints = [r["partialFingerprints"]["primaryLocationLineHash"] for r in run["results"]]
    assert len(set(prints)) == len(prints)


def test_sarif_is_stable_across_runs(repo, capsys):
    assert _scan("sarif", capsys)[1] == _scan("sarif", capsys)[1]


def test_sarif_uris_are_percent_encoded(monkeypatch):
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    finding = Finding("CG101", Severity.error, "my models/ü\nx/a b.safetensors", "m", None, None)
    log = json.loads(render_sarif(_report([finding])))
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(log)
    uri = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "my%20models/%C3%BC%0Ax/a%20b.safetensors"


def test_sarif_10000_findings_validate():
    report = _report([_finding(i) for i in range(10_000)])
    log = json.loads(render_sarif(report))
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(log)
    assert len(log["runs"][0]["results"]) == 10_000


# ------------------------------------------------------------------ markdown


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]


def test_markdown_sections_and_escaping(repo, capsys):
    code, out = _scan("markdown", capsys)
    assert code == 1
    assert out.startswith("## :x: ckpt-guard failed")
    assert "```mermaid\npie showData" in out
    assert '"fp16" :' in out and '"fp32" :' in out
    assert "<img" not in out and "**bold**" not in out and "[link]" not in out and "`code`" not in out
    assert "\u202e" not in out
    for row in _table_rows(out):  # no cell breaks from names: every row has its header's cell count
        assert row.count("|") in (6, 10), row
    assert "\n::error" not in out


def test_markdown_stays_well_under_one_mebibyte_and_says_so():
    long_name = "<|`>" * 500 + "\n::x"
    report = _report([_finding(i, tensor=long_name) for i in range(10_000)])
    text = render_markdown(report)
    assert len(text.encode("utf-8")) < 768 * 1024
    assert "more finding(s) not shown" in text and "10,000" in text


def test_markdown_passes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    save_file({"w": torch.zeros(4)}, str(tmp_path / "model.safetensors"))
    code, out = _scan("markdown", capsys)
    assert code == 0 and "passed" in out.splitlines()[0] and "No findings." in out


# ------------------------------------------------------------------ report RESULT.json


@pytest.mark.parametrize("fmt", ["text", "github", "markdown", "sarif"])
def test_report_round_trip_equals_scan(fmt, repo, capsys):
    assert main(["scan", ".", "--format", "json", "-o", "r.json"]) == 1
    code, direct = _scan(fmt, capsys)
    capsys.readouterr()
    assert main(["report", "r.json", "--format", fmt]) == code == 1
    assert capsys.readouterr().out == direct


# ------------------------------------------------------------------ bad input


def test_odd_file_names(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    weird = tmp_path / "my models" / "ü\nnew line"
    weird.mkdir(parents=True)
    save_file({"w": torch.zeros(2, dtype=torch.float16)}, str(weird / "we ird,:.safetensors"))
    code, out = _scan("github", capsys)
    commands, _ = parse_commands(out)
    assert code == 1 and len(commands) == 1
    assert commands[0][1]["file"] == "my models/ü\nnew line/we ird,:.safetensors"
    code, out = _scan("markdown", capsys)
    assert "ü\\\\nnew line" in out  # a visible, escaped "\\n" inside the cell
    assert not any(line.startswith("new line") for line in out.splitlines())
    code, out = _scan("sarif", capsys)
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(json.loads(out))


def test_unwritable_summary_still_reports_and_exits_right(repo, monkeypatch, capsys):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(repo))  # a directory: not writable as a file
    capsys.readouterr()
    assert main(["scan", ".", "--format", "github"]) == 1
    captured = capsys.readouterr()
    assert "cannot write the job summary" in captured.err
    assert parse_commands(captured.out)[0]


def test_summary_appended_under_actions(repo, monkeypatch, capsys):
    summary = repo / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main(["scan", "good", "bad"]) == 1
    text = summary.read_text()
    assert text.startswith("earlier step\n## :x: ckpt-guard failed")


@pytest.mark.parametrize("render", [render_github, render_markdown, render_sarif])
def test_a_one_megabyte_name_stays_bounded(render):
    big = "A" * (1 << 20)
    finding = Finding("CG101", Severity.error, "m/model.safetensors", f"e.g. {big!r}", big, None)
    out = render(_report([finding]))
    small = Finding("CG101", Severity.error, "m/model.safetensors", "e.g. 'A'", "A", None)
    baseline = len(render(_report([small])))  # SARIF lists every rule of the catalogue: it grows with it
    assert len(out) < baseline + 32 * 1024, (len(out), baseline)


def test_markdown_names_never_become_links(monkeypatch):
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    name = "[link](javascript:alert(1)) ![i](http://x/i.png) a\\|b"
    text = render_markdown(_report([Finding("CG101", Severity.error, "m/x.safetensors", name, name, None)]))
    assert "](" not in text and "<" not in text
    row = [line for line in text.splitlines() if line.startswith("| error")][0]
    assert len(re.findall(r"(?<!\\)\|", row)) == 6
