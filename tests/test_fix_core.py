"""`ckpt-guard fix`: the plan, the config.json rewrite, publishing and rollback, and what reporters show.

Layouts are written by transformers (a tiny bf16 Llama whose config.json says float32: CG103);
assertions are on bytes on disk, exit codes, and what transformers loads afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings, strategies as st
from scanning import tree_state

from guard.cli import main
from guard.config import Policy
from guard.fix.apply import STAGING_PREFIX, apply_plan, sweep_stale_staging
from guard.fix.context import FixOptions, Staged
from guard.fix.plan import plan_fixes, render_plan, selected
from guard.jsonspan import JsonSpanError, find_values
from guard.scan import scan_paths

SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bf16 Llama saved by transformers, then its config saved again declaring float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("llama") / "llama"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    model.config.dtype = torch.float32
    model.config.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    return out


@pytest.fixture
def model(llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(llama, tmp_path / "m")
    return Path("m")


def fix_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["fix", "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def scan_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["scan", "--format", "json", "--no-summary", *args])
    return code, json.loads(capsys.readouterr().out)


# --- dry run --------------------------------------------------------------------------------------------

def test_a_dry_run_plans_the_rewrite_exits_1_and_changes_no_byte(model: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    before = tree_state(tmp_path)
    code = main(["fix", "m", "--expect", "bf16"])
    out = capsys.readouterr().out
    assert code == 1
    assert "[safe] config-dtype (CG103)" in out and 'line 8: dtype: "float32" -> "bfloat16"' in out
    assert "rewrites m/config.json" in out and "nothing written (dry run)" in out
    assert tree_state(tmp_path) == before
    code, report = fix_json(capsys, "m", "--expect", "bf16")
    assert code == 1 and tree_state(tmp_path) == before
    plan = report["extra"]["fix"]["plan"]
    assert [(p["action"], p["codes"], p["enabled"]) for p in plan] == [("config-dtype", ["CG103"], True)]
    assert report["extra"]["fix"]["outcomes"] == [] and report["extra"]["fix"]["after"] is None


def test_a_dry_run_lists_fixes_waiting_for_flags_and_findings_without_a_fix(model: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, report = fix_json(capsys, "m")  # the default expectation is fp32: CG101 on the bf16 weights
    fix = report["extra"]["fix"]
    cast = next(p for p in fix["plan"] if p["action"] == "set-cast")
    assert cast["enabled"] is False and cast["waiting_for"] == "--cast --replace" and cast["codes"] == ["CG101"]
    assert cast["params"]["to"] == "F32" and cast["params"]["files"] == ["model.safetensors"]
    assert [u["code"] for u in fix["unfixable"]] == ["CG104"] and fix["unfixable"][0]["reason"]
    assert code == 1


def test_nothing_to_fix_exits_with_the_scans_code(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (model / "config.json").write_text((model / "config.json").read_text().replace("float32", "bfloat16"))
    assert main(["fix", "m", "--expect", "bf16"]) == 0
    assert "0 fix(es) planned" in capsys.readouterr().out
    assert main(["fix", "m", "--expect", "bf16", "--write"]) == 0
    assert main(["fix", "does-not-exist"]) == 2
    assert main(["fix", "m", "--select", "XX9"]) == 2


# --- --write: the config rewrite ------------------------------------------------------------------------

def test_write_rewrites_only_the_value_and_transformers_loads_the_weights_dtype(
        model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    old = (model / "config.json").read_bytes()
    before = tree_state(tmp_path)
    code = main(["fix", "m", "--expect", "bf16", "--write", "--changed", str(tmp_path.parent / "changed.txt")])
    out = capsys.readouterr().out
    assert code == 0, out
    new = (model / "config.json").read_bytes()
    at = old.index(b'"float32"')
    assert new == old[:at] + b'"bfloat16"' + old[at + len(b'"float32"'):]
    after = tree_state(tmp_path)
    assert set(after) == set(before)  # no staging directory, no backup of config.json
    assert {k for k in after if after[k] != before[k]} == {"m/config.json"}
    assert after["m/config.json"][1] == before["m/config.json"][1]  # its mode kept
    assert "\nbefore: 0 error(s), 1 warning(s), " in out and "; after: 0 error(s), 0 warning(s), " in out
    assert out.endswith("\nckpt-guard fix: passed: 1 of 1 fix(es) applied\n")
    assert (tmp_path.parent / "changed.txt").read_text() == "m/config.json\n"
    code, report = scan_json(capsys, "m", "--expect", "bf16")
    assert code == 0 and "CG103" not in {f["code"] for f in report["findings"]}
    assert AutoConfig.from_pretrained(model).dtype == torch.bfloat16
    assert AutoModelForCausalLM.from_pretrained(model, dtype="auto").dtype == torch.bfloat16


def test_the_fixer_hooks_last_line_agrees_with_what_it_did(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The ckpt-guard-fix hook's entry: CG103 fixed, the bf16 weights' CG101 left to the scan hook, exit 1 because
    a file was written. Its last line said "passed ... 1 error(s)"."""
    entry = ["fix", "--write", "--select", "CG103,CG008", "--fail-on", "never", "--exit-non-zero-on-fix", "m"]
    assert main(entry) == 1
    *_, counts, last = capsys.readouterr().out.splitlines()
    assert counts.startswith("before: 1 error(s), 1 warning(s), ") and "; after: 1 error(s), 0 warning(s), " in counts
    assert counts.endswith(" (fail-on: never)")
    assert last == "ckpt-guard fix: FAILED: 1 of 1 fix(es) applied; wrote 1 file(s): review and stage them " \
                   "(--exit-non-zero-on-fix)"
    assert main(entry) == 0  # staged, the next run: nothing written
    assert capsys.readouterr().out.splitlines()[-1] == "ckpt-guard fix: passed: nothing to fix"
    assert main(["fix", "--write", "m"]) == 1  # the CG101 left fails at fail-on error
    assert capsys.readouterr().out.splitlines()[-1] == (
        "ckpt-guard fix: FAILED: nothing to fix; findings at or above fail-on (error) remain")


def test_json_after_write_is_the_rescan_with_outcomes(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = fix_json(capsys, "m", "--expect", "bf16", "--write")
    fix = report["extra"]["fix"]
    assert code == 0 and fix["written"] is True
    assert fix["before"]["warning"] == 1 and fix["after"]["warning"] == 0 and fix["after"]["exit_code"] == 0
    [outcome] = fix["outcomes"]
    assert outcome["ok"] and outcome["written"] == ["m/config.json"] and outcome["backups"] == []
    assert "CG103" not in {f["code"] for f in report["findings"]}


NESTED = """{
    "architectures" :   ["LlamaForCausalLM"],
    "name_or_path": "mod\\u00e8le \\"quoted\\" ✓ é",
    "torch\\u005fdtype": "float16",
    "dtype": "float32",
    "text_config": {
        "torch_dtype"  :	"float32",
        "nested": {"deeper": [1, 2.5e-3, null, {"dtype": "float32"}]}
    },
    "vision_config": {"dtype": "auto"},
    "quantization_config": null
}"""


def test_nested_configs_keep_their_keys_and_every_other_byte(model: Path, llama: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    base = json.loads((llama / "config.json").read_text())
    text = NESTED.replace('"architectures"', "".join(f'"{k}": {json.dumps(v)},\n    ' for k, v in base.items()
                                                      if k not in ("dtype", "architectures")) + '"architectures"')
    (model / "config.json").write_text(text, encoding="utf-8")
    code, report = fix_json(capsys, "m", "--expect", "bf16")
    cg103 = [f for f in report["findings"] if f["code"] == "CG103"]
    assert len(cg103) == 4  # torch_dtype, dtype, text_config.torch_dtype, and the two top-level keys disagreeing
    [planned] = [p for p in report["extra"]["fix"]["plan"] if p["action"] == "config-dtype"]  # one rewrite for all
    assert "disagree" in planned["description"]
    assert sorted(e["key"] for e in planned["params"]["edits"]) == ["dtype", "text_config.torch_dtype", "torch_dtype"]
    assert main(["fix", "m", "--expect", "bf16", "--write"]) == 0
    new = (model / "config.json").read_text(encoding="utf-8")
    expected = text.replace('"torch\\u005fdtype": "float16"', '"torch\\u005fdtype": "bfloat16"').replace(
        '"dtype": "float32",\n    "text_config"', '"dtype": "bfloat16",\n    "text_config"').replace(
        '"torch_dtype"  :\t"float32"', '"torch_dtype"  :\t"bfloat16"')
    assert new == expected  # keys kept (the escaped one too), the array's "dtype" is no config key
    parsed = json.loads(new)
    assert parsed["torch_dtype"] == parsed["dtype"] == parsed["text_config"]["torch_dtype"] == "bfloat16"
    assert parsed["vision_config"]["dtype"] == "auto"
    code, report = scan_json(capsys, "m", "--expect", "bf16")
    assert "CG103" not in {f["code"] for f in report["findings"]}


def test_a_config_that_is_not_json_is_never_rewritten(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = (model / "config.json").read_bytes()[:-20]
    (model / "config.json").write_bytes(broken)
    code, report = fix_json(capsys, "m", "--expect", "bf16", "--write")
    fix = report["extra"]["fix"]
    assert [p["action"] for p in fix["plan"]] == [] and fix["outcomes"] == []
    assert [(u["code"], u["path"]) for u in fix["unfixable"]][:1] == [("CG001", "m/config.json")]
    assert fix["unfixable"][0]["reason"].startswith("config.json is not valid JSON at line ")
    assert (model / "config.json").read_bytes() == broken
    assert code == 1  # CG001 still fails the re-scan


@pytest.mark.parametrize("edit", ["trailing comma", "missing comma"])
def test_a_hand_broken_config_gets_where_and_what_not_re_export_advice(model: Path, edit: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A person's edit of config.json: the advice names the line and column and says to correct the file (re-
    exporting the weights, the advice for a broken weight file, would not touch it)."""
    lines = (model / "config.json").read_text(encoding="utf-8").splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if '"dtype"' in line)
    if edit == "trailing comma":
        lines[-2] = lines[-2].rstrip("\n") + ",\n"  # the last member, before the closing brace
        line, column = len(lines), 1
    else:
        lines[at] = lines[at].replace(",\n", "\n")
        line, column = at + 2, lines[at + 1].index('"') + 1
    (model / "config.json").write_text("".join(lines), encoding="utf-8")
    assert main(["fix", "m"]) == 1
    out = capsys.readouterr().out
    assert f"m/config.json: CG001 config.json is not valid JSON at line {line}, column {column} (Expecting " in out
    assert "correct the file there by hand" in out and "re-export" not in out
    assert main(["scan", "m"]) == 1  # the scan's verdict is unchanged: CG001, an error


def test_select_and_ignore_take_code_prefixes(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def actions(*args: str) -> list[str]:
        _, report = fix_json(capsys, "m", *args)
        return sorted(p["action"] for p in report["extra"]["fix"]["plan"])

    assert actions() == ["config-dtype", "set-cast"]
    assert actions("--select", "CG103") == ["config-dtype"]
    assert actions("--select", "CG1", "--ignore", "CG10") == []
    assert actions("--select", "CG1", "--ignore", "CG101") == ["config-dtype"]
    assert actions("--ignore", "cg103") == ["set-cast"]
    assert actions("--ignore", "CG1", "--select", "CG103") == ["config-dtype"]  # the longer prefix wins
    assert selected("CG103", (), ()) and not selected("CG103", ("CG2",), ())
    code, report = fix_json(capsys, "m", "--expect", "bf16", "--ignore", "CG103")
    assert code == 0 and report["extra"]["fix"]["plan"] == []  # nothing to fix: the scan's own exit code
    assert {f["code"] for f in report["findings"]} >= {"CG103"}  # --ignore chooses fixes, not the findings


# --- flags: --cast, --to-config -------------------------------------------------------------------------

def test_cast_of_the_primary_set_brings_config_json_along(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = fix_json(capsys, "m", "--expect", "fp16", "--cast", "--replace")
    plan = report["extra"]["fix"]["plan"]
    assert [(p["action"], p["codes"]) for p in plan] == [("set-cast", ["CG101"]), ("config-dtype", ["CG103"])]
    assert plan[1]["params"]["value"] == "float16"  # the dtype the cast writes, not the one the weights had
    code, report = fix_json(capsys, "m", "--expect", "fp16", "--cast", "--replace", "--write")
    assert code == 0, report["extra"]["fix"]["outcomes"]
    assert json.loads((model / "config.json").read_text())["dtype"] == "float16"
    assert (model / "model.safetensors.orig").is_file()
    assert not {"CG101", "CG103"} & {f["code"] for f in report["findings"]}


def test_to_config_casts_the_weights_instead(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old_config = (model / "config.json").read_bytes()
    code, report = fix_json(capsys, "m", "--expect", "fp32", "--to-config")
    [planned] = [p for p in report["extra"]["fix"]["plan"] if "CG103" in p["codes"]]
    assert planned["action"] == "set-cast" and planned["waiting_for"] == "--replace"
    assert planned["params"]["to"] == "F32" and planned["params"]["replace"] is True
    code, report = fix_json(capsys, "m", "--expect", "fp32", "--to-config", "--replace", "--write")
    assert code == 0, report["extra"]["fix"]["outcomes"]
    assert (model / "config.json").read_bytes() == old_config
    assert not {"CG101", "CG103"} & {f["code"] for f in report["findings"]}


# --- what reporters show --------------------------------------------------------------------------------

def test_every_finding_says_whether_it_has_a_fix(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, report = scan_json(capsys, "m")
    fixes = {f["code"]: f["fix"] for f in report["findings"]}
    assert all({"available", "safety", "description", "writes"} <= set(fix) for fix in fixes.values())
    assert fixes["CG103"]["available"] and fixes["CG103"]["safety"] == "safe"
    assert fixes["CG103"]["writes"] == ["m/config.json"] and fixes["CG103"]["action"] == "config-dtype"
    assert fixes["CG101"]["safety"] == "needs-flag" and fixes["CG101"]["flag"] == "--cast --replace"
    assert fixes["CG104"] == {**fixes["CG104"], "available": False, "safety": "none", "writes": []}
    assert fixes["CG104"]["description"].startswith("no mechanical fix:")


def test_sarif_carries_the_config_rewrite_as_a_fix_that_validates(model: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    main(["scan", "--format", "sarif", "--no-summary", "m"])
    log = json.loads(capsys.readouterr().out)
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(log)
    results = {r["ruleId"]: r for r in log["runs"][0]["results"]}
    assert "fixes" not in results["CG101"] and "fixes" not in results["CG104"]
    [fix] = results["CG103"]["fixes"]
    [change] = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"] == "m/config.json"
    [replacement] = change["replacements"]
    region, text = replacement["deletedRegion"], replacement["insertedContent"]["text"]
    old = (model / "config.json").read_bytes()
    lines = old.decode().splitlines(keepends=True)
    assert lines[region["startLine"] - 1][region["startColumn"] - 1:region["endColumn"] - 1] == '"float32"'
    # a tool applying the replacement gets exactly what `fix --write` writes
    applied = old[:region["byteOffset"]] + text.encode() + old[region["byteOffset"] + region["byteLength"]:]
    assert main(["fix", "m", "--write", "--select", "CG103"]) == 1  # CG101 (fp32 expected) still fails
    assert (model / "config.json").read_bytes() == applied


def test_text_and_markdown_say_how_many_findings_can_be_fixed(model: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    main(["scan", "--no-summary", "m"])
    text = capsys.readouterr().out
    assert ("ckpt-guard: 1 finding can be fixed: `ckpt-guard fix --write`; 1 more with flags "
            "(`ckpt-guard fix` shows the plan)") in text
    assert text.rstrip().splitlines()[-1].startswith("ckpt-guard: FAILED")  # the verdict stays last
    main(["scan", "--no-summary", "-f", "markdown", "m"])
    assert "1 finding can be fixed: `ckpt-guard fix --write`" in capsys.readouterr().out
    main(["scan", "--no-summary", "m", "--select", "CG104"])
    assert "can be fixed" not in capsys.readouterr().out
    main(["scan", "--no-summary", "m", "--select", "CG101"])
    assert "1 finding can be fixed with flags: `ckpt-guard fix` shows the plan" in capsys.readouterr().out


def test_hostile_names_are_escaped_in_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    hostile = "\x1b]0;pwned\x07\u202e\n::error::x"
    (tmp_path / "m").mkdir()
    save_file({hostile: torch.zeros(8, dtype=torch.bfloat16), "w": torch.zeros(4)},
              str(tmp_path / "m" / f"model{hostile[:8]}.safetensors"))
    (tmp_path / "m" / "config.json").write_text(json.dumps({"torch_dtype": "float32", "name": hostile}))
    code = main(["fix", "m", "--expect", "bf16", "--patch", str(tmp_path / "p.diff")])
    out = capsys.readouterr().out
    assert code == 1 and "set-cast" in out
    assert not any(ch in out for ch in "\x1b\x07\u202e") and "::error::" not in out.replace("\\n::error::", "")
    patch = (tmp_path / "p.diff").read_text()
    assert "\\u001b]0;pwned\\u0007\\u202e" in patch and "\x1b" not in patch  # JSON's own escaping, as in the file


# --- the patch ------------------------------------------------------------------------------------------

def test_the_patch_applies_with_git_and_equals_the_write(model: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(tmp_path / "m", tmp_path / "repo" / "m")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path / "repo", check=True)
    patch = tmp_path.parent / "fix.patch"
    before = tree_state(tmp_path)
    assert main(["fix", "m", "--expect", "bf16", "--patch", str(patch)]) == 1
    assert tree_state(tmp_path) == before  # the patch is staged outside the tree
    text = patch.read_text()
    assert text.startswith("diff --git a/m/config.json b/m/config.json\n--- a/m/config.json\n+++ b/m/config.json\n")
    assert '-  "dtype": "float32",\n+  "dtype": "bfloat16",\n' in text
    subprocess.run(["git", "apply", str(patch)], cwd=tmp_path / "repo", check=True)
    assert main(["fix", "m", "--expect", "bf16", "--write"]) == 0
    assert (tmp_path / "repo" / "m" / "config.json").read_bytes() == (model / "config.json").read_bytes()


def test_a_patch_for_a_file_without_a_final_newline(model: Path, tmp_path: Path) -> None:
    path = model / "config.json"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    shutil.copytree(tmp_path / "m", tmp_path / "repo" / "m")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path / "repo", check=True)
    patch = tmp_path.parent / "fix.patch"
    main(["fix", "m", "--expect", "bf16", "--patch", str(patch)])
    subprocess.run(["git", "apply", str(patch)], cwd=tmp_path / "repo", check=True)
    main(["fix", "m", "--expect", "bf16", "--write"])
    assert (tmp_path / "repo" / "m" / "config.json").read_bytes() == path.read_bytes()


# --- apply: refusal, rollback, staging ------------------------------------------------------------------

def _plan(target: str = "m", **options: object):  # type: ignore[no-untyped-def]
    policy = Policy(expect="BF16")
    opts = FixOptions(write=True, **options)  # type: ignore[arg-type]
    return plan_fixes(scan_paths([target], policy), opts), opts, policy


def test_a_fix_whose_verification_fails_is_rolled_back(model: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import guard.fix.actions.config_dtype as action

    monkeypatch.setattr(action, "verify_rewrite", lambda old, new, edits: ["planted: the value did not stick"])
    before = tree_state(tmp_path)
    code = main(["fix", "m", "--expect", "bf16", "--write"])
    out = capsys.readouterr().out
    assert code == 1  # the re-scan alone would pass (CG103 is a warning): a fix that failed fails the run
    assert "NOT FIXED" in out and "planted: the value did not stick" in out
    assert tree_state(tmp_path) == before


def test_a_file_changed_since_the_scan_is_refused(model: Path) -> None:
    plan, options, policy = _plan()
    config = model / "config.json"
    changed = config.read_bytes().replace(b'"dtype": "float32"', b'"dtype":  "float32"')
    config.write_bytes(changed)
    [outcome] = apply_plan(plan, options, policy)
    assert not outcome.ok and "changed since the scan" in (outcome.error or "")
    assert config.read_bytes() == changed
    assert not [p for p in model.iterdir() if p.name.startswith(STAGING_PREFIX)]


def _fake_action(files: dict[str, bytes]):  # type: ignore[no-untyped-def]
    def stage_fake(fix, ctx):  # type: ignore[no-untyped-def]
        staged = Staged(summary="fake")
        for name, data in files.items():
            (ctx.staging / name).write_bytes(data)
            staged.files.append((ctx.staging / name, ctx.final(name)))
        return staged
    return stage_fake


def _fake_plan(monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes]):  # type: ignore[no-untyped-def]
    import sys
    import types

    from guard.fix import actions
    from guard.fix.plan import FixPlan, PlannedFix
    from guard.fixes import make_fix

    module = types.ModuleType("fake_fix_action")
    module.stage_fake = _fake_action(files)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_fix_action", module)
    monkeypatch.setitem(actions.ACTIONS, "add-copy", "fake_fix_action:stage_fake")
    fix = make_fix("add-copy", "fake", writes=tuple(f"m/{n}" for n in files), dir="m")
    return FixPlan([PlannedFix(None, fix, True, None)], [])


def test_replacing_a_weight_file_needs_replace_and_keeps_a_backup(model: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    old = (model / "model.safetensors").read_bytes()
    plan = _fake_plan(monkeypatch, {"model.safetensors": b"new weights", "extra.json": b"{}"})
    before = tree_state(tmp_path)
    [outcome] = apply_plan(plan, FixOptions(write=True), Policy())
    assert not outcome.ok and "give --replace" in (outcome.error or "") and tree_state(tmp_path) == before
    [outcome] = apply_plan(plan, FixOptions(write=True, replace=True), Policy())
    assert outcome.ok and outcome.backups == ["m/model.safetensors.orig"]
    assert (model / "model.safetensors").read_bytes() == b"new weights"
    assert (model / "model.safetensors.orig").read_bytes() == old and (model / "extra.json").read_bytes() == b"{}"
    [outcome] = apply_plan(plan, FixOptions(write=True, replace=True), Policy())  # an older backup is kept
    assert outcome.backups == ["m/model.safetensors.2.orig", "m/extra.json.orig"]
    assert (model / "model.safetensors.orig").read_bytes() == old
    [outcome] = apply_plan(plan, FixOptions(write=True, replace=True, backup=False), Policy())
    assert outcome.ok and outcome.backups == [] and not (model / "model.safetensors.3.orig").exists()
    report = scan_paths(["m"], Policy())
    assert [f.path for m in report.models for f in m.files] == ["m/model.safetensors"]  # backups are not weights


def test_an_error_between_two_renames_restores_the_old_files(model: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _fake_plan(monkeypatch, {"config.json": b"{}", "model.safetensors": b"new", "new.json": b"{}"})
    before = tree_state(tmp_path)
    real_replace, calls = os.replace, []

    def failing_replace(src, dst):  # type: ignore[no-untyped-def]
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    [outcome] = apply_plan(plan, FixOptions(write=True, replace=True), Policy())
    assert not outcome.ok and "No space left on device" in (outcome.error or "")
    assert tree_state(tmp_path) == before  # config.json old again, no backup, no staging directory


def test_an_exception_in_an_action_leaves_nothing_behind(model: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _fake_plan(monkeypatch, {"new.json": b"{}"})
    import fake_fix_action  # type: ignore[import-not-found]

    def broken(fix, ctx):  # type: ignore[no-untyped-def]
        (ctx.staging / "half").write_bytes(b"x")
        raise RuntimeError("a bug")

    monkeypatch.setattr(fake_fix_action, "stage_fake", broken)
    before = tree_state(tmp_path)
    with pytest.raises(RuntimeError):  # a bug is not turned into a quiet outcome
        apply_plan(plan, FixOptions(write=True), Policy())
    assert tree_state(tmp_path) == before


def test_staging_directories_are_never_scanned_and_stale_ones_are_swept(model: Path) -> None:
    stale = model / f"{STAGING_PREFIX}999999999-abcd"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"\xff" * 100)  # half written: never a finding
    (stale / "config.json").write_text("{")
    report = scan_paths(["m"], Policy(expect="BF16"))
    assert [m.path for m in report.models] == ["m"] and "CG001" not in {f.code for f in report.findings}
    sweep_stale_staging(model)
    assert not stale.exists()
    live = model / f"{STAGING_PREFIX}{os.getpid()}-abcd"
    live.mkdir()
    sweep_stale_staging(model)
    assert live.exists()  # this process's own


def test_identical_fixes_are_applied_once(model: Path) -> None:
    config = model / "config.json"
    config.write_text(config.read_text().replace('"dtype": "float32"', '"dtype": "float32", "torch_dtype": "float16"'))
    plan, options, policy = _plan()
    [planned] = plan.fixes
    assert len(planned.findings) == 3 and {f.code for f in planned.findings} == {"CG103"}
    assert "3 findings" not in render_plan(plan) and "config-dtype (CG103)" in render_plan(plan)
    [outcome] = apply_plan(plan, options, policy)
    assert outcome.ok and json.loads(config.read_text())["torch_dtype"] == "bfloat16"


def test_add_requests_are_planned_without_a_finding(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = fix_json(capsys, "m", "--expect", "bf16", "--add", "flax", "--add", "safetensors")
    fix = report["extra"]["fix"]
    added = [p for p in fix["plan"] if p["action"] == "add-copy"]
    assert [(p["params"]["what"], p["codes"], p["enabled"]) for p in added] == [("flax", [], True)]
    assert [n["request"] for n in fix["not_added"]] == ["m: --add safetensors"]  # it has one
    assert code == 1


# --- the span locator -----------------------------------------------------------------------------------

def test_span_locator_handles_escapes_nesting_whitespace_and_duplicates() -> None:
    text = '{"a" :[1,{"torch\\u005fdtype":"x"}],\n "t":{ "dtype" : "f32", "é":"\\"}", "dtype":"f16"}}'
    first, second = find_values(text, ("t", "dtype"))
    assert (first.token, first.line, first.column) == ('"f32"', 2, 18)
    assert second.token == '"f16"' and second.offset == len(text[:second.start].encode()) == second.start + 1
    assert [s.token for s in find_values(text, ("a", 1, "torch_dtype"))] == ['"x"']
    assert find_values(text, ("a", "1", "torch_dtype")) == [] and find_values(text, ("t",)) == []
    for bad in ("{", '{"a":1,}', "[1 2]", '{"a" 1}', "1 2", "", '"\x01"', "[01]", "{'a': 1}"):
        with pytest.raises(JsonSpanError):
            find_values(bad, ("a",))
    deep = "[" * 100_000 + '{"dtype": "f"}' + "]" * 100_000
    assert [s.token for s in find_values(deep, (*([0] * 100_000), "dtype"))] == ['"f"']  # no recursion


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=5),
       indent=st.sampled_from([None, 0, 2, "\t"]), ascii_only=st.booleans())
def test_span_locator_agrees_with_json_loads(doc: dict, indent: object, ascii_only: bool) -> None:
    text = json.dumps(doc, indent=indent, ensure_ascii=ascii_only)  # type: ignore[arg-type]
    todo: list[tuple[tuple[object, ...], object]] = [((), doc)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, dict):
            todo += [((*path, k), v) for k, v in value.items()]
        elif isinstance(value, list):
            todo += [((*path, i), v) for i, v in enumerate(value)]
        else:
            [span] = find_values(text, path)  # type: ignore[arg-type]
            assert json.loads(span.token) == value
            assert text.encode()[span.offset:span.offset + span.length].decode() == span.token
