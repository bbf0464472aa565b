"""The hook through real `pre-commit try-repo`, on a copy of the current working tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from project_copy import copy_project
from safetensors.torch import save_file

from guard.cli import main
from guard.samples import save_torch_bin

ROOT = Path(__file__).resolve().parents[1]
PRE_COMMIT = [sys.executable, "-m", "pre_commit"]
HOOK_REPO_FILES = ("pyproject.toml", "README.md", "LICENSE", ".pre-commit-hooks.yaml", "guard")

pytestmark = pytest.mark.slow


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """try-repo clones HEAD; the tree under test may be uncommitted, so commit a copy of it."""
    repo = tmp_path_factory.mktemp("hook-repo")
    copy_project(repo, HOOK_REPO_FILES)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "hook under test")
    return repo


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pre-commit-home")  # one env build for the whole module


def user_repo(root: Path, models: dict[str, dict[str, torch.Tensor]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    for rel, tensors in models.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(root / rel))
    (root / "README.txt").write_text("not a checkpoint\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "models")
    return root


def try_repo(target: Path, hook_repo: Path, home: Path, *args: str,
             hook: str = "ckpt-guard") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PRE_COMMIT"))}
    env |= {"PRE_COMMIT_HOME": str(home), "GIT_CONFIG_GLOBAL": os.devnull, "NO_COLOR": "1"}
    return subprocess.run([*PRE_COMMIT, "try-repo", str(hook_repo), hook, "--verbose", *args],
                          cwd=target, env=env, capture_output=True, text=True, timeout=600)


GOOD = {"w": torch.zeros(4, 4), "b": torch.zeros(4)}
BAD = {"w": torch.zeros(4, 4, dtype=torch.float16), "b": torch.zeros(4)}


def test_manifest_validates():
    result = subprocess.run([*PRE_COMMIT, "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_fixer_hook_selects_the_same_files_and_only_safe_fixes():
    import yaml

    scan, fixer = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert fixer["id"] == "ckpt-guard-fix" and fixer["files"] == scan["files"] and fixer["types"] == scan["types"]
    entry = fixer["entry"].split()
    assert entry[:3] == ["ckpt-guard", "fix", "--write"] and entry[entry.index("--select") + 1] == "CG103,CG008"
    assert ("--exit-non-zero-on-fix" in entry
            and not {"--replace", "--cast", "--allow-lossy", "--to-config"} & set(entry))
    assert "pre-push" not in fixer["stages"]  # a fix in the working tree cannot change the commits being pushed


def test_bad_model_fails_with_its_code(tmp_path, hook_repo, pre_commit_home):
    target = user_repo(tmp_path / "u", {"good/model.safetensors": GOOD, "bad/model.safetensors": BAD})
    result = try_repo(target, hook_repo, pre_commit_home, "--all-files")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Failed" in out and "CG101" in out and "bad/model.safetensors" in out
    assert "README.txt" not in out  # files: kept it away from the hook


def test_good_model_passes(tmp_path, hook_repo, pre_commit_home):
    target = user_repo(tmp_path / "u", {"good/model.safetensors": GOOD})
    result = try_repo(target, hook_repo, pre_commit_home, "--all-files")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Passed" in result.stdout


def _sharded(names: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    return {f"sharded/{name}": {f"t{i}": torch.zeros(2)} for i, name in enumerate(names)}


def _write_index(root: Path, names: list[str]) -> None:
    index = {"metadata": {}, "weight_map": {f"t{i}": name for i, name in enumerate(names)}}
    (root / "sharded" / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def test_a_subset_of_shards_is_checked_against_its_siblings_on_disk(tmp_path, hook_repo, pre_commit_home):
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    target = user_repo(tmp_path / "u", _sharded(names))
    _write_index(target, names + ["model-00003-of-00002.safetensors"])  # names a shard that is not there
    git(target, "add", "-A")
    git(target, "commit", "-q", "-m", "index")
    # the hook receives one shard only; the index and the other shard are read from disk
    result = try_repo(target, hook_repo, pre_commit_home, "--files", f"sharded/{names[0]}")
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "CG004" in out, out


def test_long_file_lists_are_batched_and_any_batch_fails_the_hook(tmp_path, hook_repo, pre_commit_home):
    long_dir = "d" * 120
    models = {f"{long_dir}/{i:04d}/{'x' * 100}.safetensors": GOOD for i in range(700)}
    models[f"{long_dir}/9999/bad.safetensors"] = BAD  # sorts last: lands in a later batch
    target = user_repo(tmp_path / "u", models)
    result = try_repo(target, hook_repo, pre_commit_home, "--all-files")
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "CG101" in out, out[-3000:]
    assert out.count("ckpt-guard: ") >= 2  # one summary line per batch: more than one call


def test_scan_of_one_shard_reads_the_model_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for rel, tensors in _sharded(names).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, rel)
    _write_index(tmp_path, names)
    assert main(["scan", f"sharded/{names[0]}", "--format", "json", "-o", "r.json"]) == 0
    report = json.loads(Path("r.json").read_text())
    assert [m["path"] for m in report["models"]] == ["sharded"]
    assert len(report["models"][0]["files"]) == 2
    os.remove(f"sharded/{names[1]}")
    assert main(["scan", f"sharded/{names[0]}"]) == 1
    assert "CG004" in capsys.readouterr().out


# ------------------------------------------------------------------ plain git hooks (no framework)


def _hook_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PRE_COMMIT"))}
    return env | {"CKPT_GUARD": str(Path(sys.executable).parent / "ckpt-guard"), "GIT_CONFIG_GLOBAL": os.devnull,
                  "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
                  "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, env=_hook_env(), capture_output=True, text=True, timeout=120)


def test_plain_pre_commit_hook(tmp_path):
    repo = user_repo(tmp_path / "u", {"good/model.safetensors": GOOD})
    shutil.copy2(ROOT / "hooks" / "pre-commit", repo / ".git" / "hooks" / "pre-commit")
    (repo / "notes.txt").write_text("no checkpoint staged\n")
    _run(repo, "git", "add", "notes.txt")
    assert _run(repo, "git", "commit", "-q", "-m", "notes").returncode == 0
    odd = repo / "odd dir ü" / "new\nline.safetensors"
    odd.parent.mkdir()
    save_file(BAD, str(odd))
    _run(repo, "git", "add", "-A")
    result = _run(repo, "git", "commit", "-q", "-m", "bad")
    assert result.returncode != 0 and "CG101" in result.stdout + result.stderr
    _run(repo, "git", "rm", "-q", "--cached", "-r", "odd dir ü")
    save_file({"w": torch.ones(8)}, str(repo / "good" / "model.safetensors"))  # a staged, passing change
    _run(repo, "git", "add", "-A", "good")
    assert _run(repo, "git", "commit", "-q", "-m", "good").returncode == 0


def test_plain_pre_push_hook(tmp_path):
    remote = tmp_path / "remote.git"
    _run(tmp_path, "git", "init", "-q", "--bare", str(remote))
    repo = user_repo(tmp_path / "u", {"good/model.safetensors": GOOD})
    shutil.copy2(ROOT / "hooks" / "pre-push", repo / ".git" / "hooks" / "pre-push")
    _run(repo, "git", "remote", "add", "origin", str(remote))
    assert _run(repo, "git", "push", "-q", "origin", "main").returncode == 0  # new branch: all, good
    (repo / "bad").mkdir()
    save_file(BAD, str(repo / "bad" / "model.safetensors"))
    _run(repo, "git", "add", "-A")
    _run(repo, "git", "commit", "-q", "-m", "bad")
    result = _run(repo, "git", "push", "-q", "origin", "main")
    assert result.returncode != 0 and "CG101" in result.stdout + result.stderr


def test_a_commit_of_one_variant_file_scans_that_component(tmp_path, hook_repo, pre_commit_home):
    """diffusers' fp16 variant named fp16 but holding fp32, and a format no reader handles: both reach
    the hook through its `files:` pattern, and the component's default copy is read from disk."""
    target = user_repo(tmp_path / "u", {"unet/diffusion_pytorch_model.safetensors": GOOD,
                                         "unet/diffusion_pytorch_model.fp16.safetensors": GOOD})
    (target / "unet" / "model.caffemodel").write_bytes(b"\0" * 1024)
    git(target, "add", "-A")
    git(target, "commit", "-q", "-m", "variant")
    result = try_repo(target, hook_repo, pre_commit_home, "--files", "unet/diffusion_pytorch_model.fp16.safetensors",
                      "unet/model.caffemodel")
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "CG108" in out and "CG006" in out and "CG102" not in out, out


def test_a_commit_of_a_dcp_checkpoint_reaches_the_hook(tmp_path, hook_repo, pre_commit_home):
    """torch.distributed.checkpoint's own save: its rank files reach the hook, which reads the set through its
    .metadata; a save that never finished (rank files, no .metadata) is CG117."""
    import torch.distributed.checkpoint as dcp

    target = user_repo(tmp_path / "u", {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group": the documented single-process save
        dcp.save({"model": {"w": torch.zeros(4, 4), "b": torch.zeros(4, dtype=torch.bfloat16)}},
                 checkpoint_id=str(target / "step-1"))
    (target / "step-2").mkdir()
    (target / "step-2" / "__0_0.distcp").write_bytes((target / "step-1" / "__0_0.distcp").read_bytes())
    git(target, "add", "-A")
    git(target, "commit", "-q", "-m", "dcp")
    result = try_repo(target, hook_repo, pre_commit_home, "--all-files")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "training-state" in out and "dcp" in out and "CG102" in out  # step-1's module weights mix fp32 and bf16
    assert "step-2/__0_0.distcp: CG117" in out, out


@pytest.mark.parametrize("name, selected", [
    ("model.safetensors.index.fp16.json", True), ("unet/diffusion_pytorch_model.safetensors.fp16.index.json", True),
    ("model.fp16-00001-of-00002.safetensors", True), ("llama-q4_k_m.gguf", True), ("model.onnx", True),
    ("tf_model.h5", True), ("model_index.json", True), ("exported.pt2", True), ("model.pte", True),
    ("scripted.jit", True), ("mobile.ptl", True),
    ("saved/variables/variables.index", True), ("ckpt-3.data-00000-of-00001", True), ("m.tflite", True),
    ("weights.npz", True), ("ckpt/100/_METADATA", True),
    ("step-100/__0_0.distcp", True), ("openvino_model.xml", True),
    ("m.mlpackage/Data/com.apple.CoreML/weights/weight.bin", True), ("pom.xml", False),
    ("README.md", False),
    ("tokenizer.json", False), ("special_tokens_map.json", False),
])
def test_hook_files_pattern_selects_every_file_that_matters(name: str, selected: bool) -> None:
    import re

    import yaml

    pattern = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())[0]["files"]
    assert bool(re.search(pattern, name)) == selected
    action = (ROOT / "scripts" / "action" / "select.sh").read_text()
    assert pattern.removeprefix("(?i)") in action  # the Action's changed-only selection is the same


# ------------------------------------------------------------------ the fixer hook (ckpt-guard-fix)


def _staged_repo(root: Path) -> Path:
    """A user repository whose model is staged for its first commit, as `git add` leaves it."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    (root / "README.txt").write_text("not a checkpoint\n")
    git(root, "add", "README.txt")
    git(root, "commit", "-q", "-m", "readme")
    return root


def _save_bf16_llama(directory: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)


def test_fixer_hook_rewrites_config_dtype_fails_then_passes_once_staged(tmp_path, hook_repo, pre_commit_home):
    """A bf16 Llama saved by transformers whose config.json says float32 (CG103): the fixer rewrites the value,
    and pre-commit fails the hook because it modified a file; staged again, the next run passes."""
    target = _staged_repo(tmp_path / "u")
    _save_bf16_llama(target / "llama")
    config = target / "llama" / "config.json"
    written = config.read_text()
    key = next(k for k in ("dtype", "torch_dtype") if f'"{k}": "bfloat16"' in written)
    config.write_text(written.replace(f'"{key}": "bfloat16"', f'"{key}": "float32"'))
    declared_fp32 = config.read_bytes()
    weights = (target / "llama" / "model.safetensors").read_bytes()
    git(target, "add", "-A")

    first = try_repo(target, hook_repo, pre_commit_home, hook="ckpt-guard-fix")
    out = first.stdout + first.stderr
    assert first.returncode == 1 and "Failed" in out, out
    assert "files were modified by this hook" in out, out
    assert "ckpt-guard fix: FAILED: 1 of 1 fix(es) applied; wrote 1 file(s): review and stage them" in out, out
    # byte for byte, only the value changed; the weights were not touched
    assert config.read_bytes() == declared_fp32.replace(f'"{key}": "float32"'.encode(), f'"{key}": "bfloat16"'.encode())
    assert (target / "llama" / "model.safetensors").read_bytes() == weights
    assert not [p.name for p in (target / "llama").iterdir() if p.name.startswith(".ckpt-guard")]
    assert "llama/config.json" in git(target, "diff", "--name-only")  # changed in the tree, not yet staged

    git(target, "add", "-A")
    second = try_repo(target, hook_repo, pre_commit_home, hook="ckpt-guard-fix")
    assert second.returncode == 0 and "Passed" in second.stdout, second.stdout + second.stderr


def test_fixer_hook_writes_a_missing_safetensors_copy_and_fails_for_the_new_file(tmp_path, hook_repo,
                                                                                  pre_commit_home):
    """A pickle-only BERT (CG008): the new model.safetensors is a file pre-commit's own check does not see,
    so the hook's exit code fails it; staged, the next run passes."""
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    target = _staged_repo(tmp_path / "u")
    model = BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=32))
    save_torch_bin(model, target / "bert")
    assert not (target / "bert" / "model.safetensors").exists()
    git(target, "add", "-A")

    first = try_repo(target, hook_repo, pre_commit_home, hook="ckpt-guard-fix")
    out = first.stdout + first.stderr
    assert first.returncode == 1 and "Failed" in out and "- exit code: 1" in out, out
    assert "files were modified by this hook" not in out  # an untracked new file: only the exit code tells
    copy = load_file(target / "bert" / "model.safetensors")
    pickled = torch.load(target / "bert" / "pytorch_model.bin", weights_only=True)
    assert set(copy) == set(pickled) and all(torch.equal(copy[k], pickled[k]) for k in copy)
    assert "bert/model.safetensors" in git(target, "status", "--porcelain", "--untracked-files=all")

    git(target, "add", "-A")
    second = try_repo(target, hook_repo, pre_commit_home, hook="ckpt-guard-fix")
    assert second.returncode == 0 and "Passed" in second.stdout, second.stdout + second.stderr
