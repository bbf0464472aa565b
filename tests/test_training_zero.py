"""DeepSpeed ZeRO checkpoints written by DeepSpeed 0.19.8 itself on the CPU (tests/deepspeed_writers.py):
read as one training-state set per tag, checked, and consolidated bit-for-bit as ``zero_to_fp32`` does."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import deepspeed_writers  # noqa: E402
from hub_standin import StandinHub, standin_fixture  # noqa: E402
from scanning import codes, json_scan, model  # noqa: E402

from guard.cli import main  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not deepspeed_writers.deepspeed_available(), reason="make test installs deepspeed")]

# name -> (stage, precision, world size): each written once per module, on first use
RUNS = {"z1-bf16": (1, "bf16", 1), "z2-bf16": (2, "bf16", 2), "z3-bf16": (3, "bf16", 2),
        "z2-fp16": (2, "fp16", 1), "z3-fp16": (3, "fp16", 1)}
DTYPE_RULES = {"CG101", "CG102", "CG104", "CG108"}


@pytest.fixture(scope="module")
def zero(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("zero")
    written: dict[str, tuple[Path, dict]] = {}

    def get(name: str) -> tuple[Path, dict]:
        if name not in written:
            stage, precision, world = RUNS[name]
            path = root / name
            run = deepspeed_writers.write_zero(path, stage=stage, precision=precision, world_size=world,
                                               port=29600 + len(written))
            written[name] = (path, run)
        return written[name]

    return get


def _errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def _copy(zero, name: str, tmp_path: Path) -> tuple[Path, dict]:  # type: ignore[no-untyped-def]
    path, run = zero(name)
    return Path(shutil.copytree(path, tmp_path / name)), run


def _convert(src: Path, out: Path, *extra: str) -> int:
    return main(["convert", str(src), "--to", "torch", "--out", str(out), *extra])


def _reference(zero, name: str) -> dict:  # type: ignore[no-untyped-def]
    path, _ = zero(name)
    return safetensors_torch.load_file(f"{path}.reference.safetensors")


def _same_bits(a, b) -> bool:  # type: ignore[no-untyped-def]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("name", list(RUNS))
def test_one_training_state_set_per_tag_with_the_models_own_tensors(zero, capsys, name: str) -> None:
    path, run = zero(name)
    stage, precision, world = RUNS[name]
    code, report = json_scan(capsys, str(path))
    # config.json beside the checkpoint and no weights: a model folder whose only weights are partitions
    assert code == 0 and codes(report) == {"CG120", "CG121"} == codes(report, severity="warning")
    (entry,) = report["models"]
    assert entry["path"].endswith("global_step1")
    (only,) = entry["sets"]
    assert only["role"] == "training-state" and only["primary"]
    assert entry["parameters"] == run["parameters"]  # what num_parameters() says, not one rank's partition
    assert set(entry["dtypes"]) == {"F32"}  # the masters: what the checkpoint would publish
    notes = " ".join(only["notes"])
    module = {"bf16": "bf16", "fp16": "fp16"}[precision]
    assert f"ZeRO-{stage}" in notes and f"world size {world}" in notes and "DeepSpeed 0.19.8" in notes
    assert f"module weights {module}" in notes and "master weights fp32" in notes and "optimizer state fp32" in notes


def test_each_file_named_alone_is_read_with_its_tag(zero, capsys) -> None:
    path, run = zero("z2-bf16")
    optim = path / "global_step1" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    code, report = json_scan(capsys, str(optim))
    assert code == 0 and codes(report) == {"CG120", "CG121"}  # no CG003 for DeepSpeed's classes, no CG108
    assert model(report, "global_step1")["parameters"] == run["parameters"]


def test_the_dtype_policy_judges_the_masters(zero, capsys) -> None:
    path, _ = zero("z2-bf16")
    code, report = json_scan(capsys, str(path), "--expect", "bf16")
    # fp32 masters under a bf16 policy; never the moments
    assert code == 1 and codes(report, severity="error") == {"CG101"}


@pytest.mark.parametrize("name", list(RUNS))
def test_convert_equals_zero_to_fp32_bit_for_bit_and_loads_in_transformers(zero, tmp_path, name: str) -> None:
    from transformers import LlamaForCausalLM

    path, run = zero(name)
    out = tmp_path / "out"
    assert _convert(path, out) == 0
    ours = safetensors_torch.load_file(out / "model.safetensors")
    reference = _reference(zero, name)
    assert ours.keys() == reference.keys() == set(run["names"])
    assert all(_same_bits(ours[k], reference[k]) for k in reference)
    assert not {"latest", "zero_to_fp32.py", "zero_to_torch.py"} & {p.name for p in out.iterdir()}
    loaded, info = LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # lists (transformers 4) or sets (5)
    assert loaded.num_parameters() == run["parameters"]


def test_convert_reads_the_tag_folder_too_and_dtype_chooses(zero, tmp_path) -> None:
    path, _ = zero("z3-bf16")
    out = tmp_path / "out"
    assert _convert(path / "global_step1", out, "--dtype", "bf16") == 0  # config.json from the save folder
    ours = safetensors_torch.load_file(out / "model.safetensors")
    reference = _reference(zero, "z3-bf16")
    assert all(_same_bits(ours[k], reference[k].to(torch.bfloat16)) for k in reference)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def _refused(src: Path, tmp_path: Path, code: str, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "refused"
    capsys.readouterr()
    assert _convert(src, out, "--format", "json") == 1
    report = json.loads(capsys.readouterr().out)
    assert code in codes(report)
    assert not out.exists()


def test_a_missing_rank_is_cg114_and_nothing_is_written(zero, tmp_path, capsys) -> None:
    path, _ = _copy(zero, "z2-bf16", tmp_path)
    gone = path / "global_step1" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    gone.unlink()
    code, report = json_scan(capsys, str(path))
    assert code == 1 and codes(report, severity="error") == {"CG114"}
    (finding,) = [f for f in report["findings"] if f["code"] == "CG114"]
    assert finding["path"].endswith(gone.name) and "partition_count 2" in finding["message"]
    _refused(path, tmp_path, "CG114", capsys)


def test_a_missing_zero3_model_states_rank_is_cg114(zero, tmp_path, capsys) -> None:
    path, _ = _copy(zero, "z3-bf16", tmp_path)
    (path / "global_step1" / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    code, report = json_scan(capsys, str(path))
    assert code == 1 and codes(report, severity="error") == {"CG114"}
    assert _errors(report)[0]["path"].endswith("zero_pp_rank_1_mp_rank_00_model_states.pt")


def _edit_param_shape(states: Path, name: str, shape: tuple[int, ...]) -> None:
    data = torch.load(states, weights_only=False)  # our own file, written by DeepSpeed in this test run
    for group in data["param_shapes"]:
        if name in group:
            group[name] = torch.Size(shape)
    torch.save(data, states)


@pytest.mark.parametrize("name,states", [("z2-bf16", "mp_rank_00_model_states.pt"),
                                         ("z3-bf16", "zero_pp_rank_0_mp_rank_00_model_states.pt")])
def test_partitions_that_do_not_add_up_are_cg118(zero, tmp_path, capsys, name: str, states: str) -> None:
    path, _ = _copy(zero, name, tmp_path)
    _edit_param_shape(path / "global_step1" / states, "model.norm.weight", (40,))
    code, report = json_scan(capsys, str(path))
    assert code == 1 and codes(report, severity="error") == {"CG118"}
    _refused(path, tmp_path, "CG118", capsys)


def test_latest_naming_no_tag_is_cg119(zero, tmp_path, capsys) -> None:
    path, _ = _copy(zero, "z2-bf16", tmp_path)
    (path / "latest").write_text("global_step9")
    code, report = json_scan(capsys, str(path))
    assert code == 1 and codes(report, severity="error") == {"CG119"}
    (finding,) = _errors(report)
    assert finding["path"].endswith("latest") and "global_step9" in finding["message"]
    _refused(path, tmp_path, "CG119", capsys)


def test_a_plain_file_named_latest_is_not_deepspeeds(tmp_path, capsys) -> None:
    (tmp_path / "latest").write_text("v2 of the docs\n")
    code, report = json_scan(capsys, str(tmp_path))
    # no training finding: the folder holds no checkpoint at all, which is all it says (CG010, a warning)
    assert code == 0 and [f["code"] for f in report["findings"]] == ["CG010"]


def test_a_forged_model_states_pickle_is_cg003_and_runs_nothing(zero, tmp_path, capsys) -> None:
    path, _ = _copy(zero, "z2-bf16", tmp_path)
    sentinel = tmp_path / "ran"

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {sentinel}",))

    states = path / "global_step1" / "mp_rank_00_model_states.pt"
    with zipfile.ZipFile(states, "w") as zf:
        zf.writestr("mp_rank_00_model_states/data.pkl", pickle.dumps({"module": Payload(), "param_shapes": []},
                                                                    protocol=2))
        zf.writestr("mp_rank_00_model_states/version", "3\n")
    code, report = json_scan(capsys, str(path))
    assert code == 1 and "CG003" in codes(report)
    assert any(f["path"].endswith(states.name) and "posix.system" in f["message"] for f in report["findings"])
    _refused(path, tmp_path, "CG003", capsys)
    assert not sentinel.exists()


def test_a_truncated_optimizer_file_is_cg001(zero, tmp_path, capsys) -> None:
    path, _ = _copy(zero, "z2-bf16", tmp_path)
    optim = path / "global_step1" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    optim.write_bytes(optim.read_bytes()[: optim.stat().st_size // 2])
    code, report = json_scan(capsys, str(path))
    assert code == 1 and "CG001" in codes(report)
    assert any(f["path"].endswith(optim.name) for f in report["findings"] if f["code"] == "CG001")
    _refused(path, tmp_path, "CG001", capsys)


def test_a_checkpoint_scanned_on_its_own_publishes_nothing(zero, tmp_path, capsys) -> None:
    path, _ = _copy(zero, "z2-bf16", tmp_path)
    (path / "config.json").unlink()
    code, report = json_scan(capsys, str(path / "global_step1"))
    assert code == 0 and report["findings"] == []


def test_training_state_beside_the_consolidated_weights_is_cg120_only(zero, tmp_path, capsys) -> None:
    path, _ = _copy(zero, "z2-bf16", tmp_path)
    consolidated = tmp_path / "consolidated"
    assert _convert(path, consolidated) == 0
    shutil.copy(consolidated / "model.safetensors", path / "model.safetensors")
    code, report = json_scan(capsys, str(path))
    assert code == 0 and codes(report) == {"CG120"}
    (finding,) = report["findings"]
    assert finding["severity"] == "warning" and "optimizer state" in finding["message"]
    assert "ckpt-guard convert" in finding["message"]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    yield from standin_fixture(monkeypatch, tmp_path)


def test_the_upload_gate_refuses_a_repository_of_training_partitions(zero, standin: StandinHub, tmp_path,
                                                                     capsys) -> None:
    path, _ = _copy(zero, "z3-bf16", tmp_path)  # ZeRO-3: Trainer.save_model wrote no weights
    assert main(["hub", "upload", str(path), "org/run", "--token", "hf_bot"]) == 1
    captured = capsys.readouterr()
    assert "CG121 [error]" in captured.out and "CG120 [warning]" in captured.out
    assert "nothing uploaded" in captured.err and standin.records == []


def test_the_upload_gate_warns_of_training_state_beside_the_weights(zero, standin: StandinHub, tmp_path,
                                                                   capsys) -> None:
    path, _ = _copy(zero, "z2-bf16", tmp_path)
    consolidated = tmp_path / "consolidated"
    assert _convert(path, consolidated) == 0
    shutil.copy(consolidated / "model.safetensors", path / "model.safetensors")
    (path / "config.json").unlink()  # the gate needs no config.json to call the folder a repository
    assert main(["hub", "upload", str(path), "org/run", "--token", "hf_bot"]) == 0
    assert "CG120 [warning]" in capsys.readouterr().out
    assert "global_step1/mp_rank_00_model_states.pt" in standin.files_at("org/run")


def _repo_files(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_hub_scan_reads_the_tag_folder_by_ranged_reads(zero, standin: StandinHub) -> None:
    from guard.config import build_policy
    from guard.hub.client import HubClient
    from guard.hub.scan import scan_hub

    path, run = zero("z3-bf16")
    standin.add_repo("org/run", _repo_files(path))
    policy = build_policy({}, source=None, overrides={})
    result = scan_hub(["org/run"], policy, HubClient(token="hf_bot"), publishing=True)
    report = result.report
    (entry,) = [m for m in report.models if m.path.endswith("global_step1")]
    assert entry.parameters == run["parameters"]
    found = {f.code: f.severity.value for f in report.findings}
    assert found == {"CG120": "warning", "CG121": "error"}  # the reviewer's view: nothing loadable published
    assert "CG003" not in found and not {"CG101", "CG108"} & set(found)


def test_the_reviewer_answers_a_push_of_training_partitions_with_cg121(zero, standin: StandinHub,
                                                                       tmp_path) -> None:
    from hub_delivery import AppServer, make_reviewer

    path, _ = zero("z3-bf16")
    sha = standin.add_repo("org/run", _repo_files(path))
    service = AppServer(make_reviewer(tmp_path / "queue.sqlite3"))
    try:
        event = {"event": {"action": "update", "scope": "repo.content"},
                 "repo": {"type": "model", "name": "org/run", "id": "abc", "private": False,
                          "url": {"web": "https://hub/org/run", "api": "https://hub/api/models/org/run"},
                          "headSha": sha, "owner": {"id": "o1"}},
                 "updatedRefs": [{"ref": "refs/heads/main", "oldSha": "0" * 40, "newSha": sha}],
                 "webhook": {"id": "w1", "version": 3}}
        assert service.post(event).status_code == 202
        assert service.reviewer.wait_idle(60)
    finally:
        service.stop()
    [discussion] = standin.repos["org/run"].discussions
    assert "CG121" in discussion.description and "CG120" in discussion.description
    assert "CG003" not in discussion.description and "CG101" not in discussion.description


def test_the_plain_pre_commit_hook_says_training_state_is_being_committed(zero, tmp_path) -> None:
    import subprocess
    import sys

    path, _ = _copy(zero, "z3-bf16", tmp_path)
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PRE_COMMIT"))}
    env |= {"CKPT_GUARD": str(Path(sys.executable).parent / "ckpt-guard"), "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com"}

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=path, env=env, capture_output=True, text=True, timeout=300)

    git("init", "-q", "-b", "main")
    shutil.copy2(root / "hooks" / "pre-commit", path / ".git" / "hooks" / "pre-commit")
    git("add", "-A")
    result = git("commit", "-q", "-m", "run")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out  # warnings: the commit goes through, and says what it carries
    assert "CG120 [warning]" in out and "CG121 [warning]" in out and "CG003" not in out


def test_a_universal_checkpoint_is_one_set_and_consolidates_to_the_same_masters(zero, tmp_path, capsys) -> None:
    import subprocess
    import sys

    path, run = _copy(zero, "z2-bf16", tmp_path)
    out = path / "global_step1_universal"
    proc = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                           str(path / "global_step1"), "--output_folder", str(out), "--num_extract_workers", "1",
                           "--num_merge_workers", "1", "--inject_missing_state"],
                          env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "zero" / "model.norm.weight" / "fp32.pt").is_file()
    code, report = json_scan(capsys, str(out))
    assert code == 0 and not codes(report) & ({"CG003", "CG007"} | DTYPE_RULES), report["findings"]
    (entry,) = report["models"]  # zero/<param>/ folders are the checkpoint's, not 21 models
    assert entry["parameters"] == run["parameters"] and "universal" in " ".join(entry["sets"][0]["notes"])
    converted = tmp_path / "converted"
    assert _convert(out, converted, "--config", str(path / "config.json")) == 0
    ours = safetensors_torch.load_file(converted / "model.safetensors")
    reference = _reference(zero, "z2-bf16")
    assert ours.keys() == reference.keys() and all(_same_bits(ours[k], reference[k]) for k in reference)
    (out / "zero" / "model.norm.weight" / "fp32.pt").unlink()
    code, report = json_scan(capsys, str(out))
    assert code == 1 and codes(report, severity="error") == {"CG114"}
    sentinel = tmp_path / "ran"

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {sentinel}",))

    with zipfile.ZipFile(out / "zero" / "optimizer_state.pt", "w") as zf:  # nothing under zero/ escapes a scan
        zf.writestr("optimizer_state/data.pkl", pickle.dumps({"optimizer_state_dict": Payload()}, protocol=2))
        zf.writestr("optimizer_state/version", "3\n")
    code, report = json_scan(capsys, str(out))
    assert "CG003" in codes(report, severity="error") and not sentinel.exists()
    assert any(f["path"].endswith("zero/optimizer_state.pt") for f in report["findings"] if f["code"] == "CG003")


def test_the_trainers_checkpoint_with_deepspeed_is_read_and_consolidated(tmp_path, capsys) -> None:
    from transformers import LlamaForCausalLM

    run = deepspeed_writers.write_trainer_zero(tmp_path / "out")
    checkpoint = tmp_path / "out" / "checkpoint-1"
    assert not list(checkpoint.glob("model*.safetensors"))  # ZeRO-3: save_model wrote no weights
    code, report = json_scan(capsys, str(checkpoint))  # (out/ also holds the reference the writer saved)
    assert code == 0 and model(report, "global_step1")["parameters"] == run["parameters"]
    assert {"CG120", "CG121"} <= codes(report, severity="warning") and not codes(report, severity="error")
    out = tmp_path / "consolidated"
    assert _convert(checkpoint, out) == 0  # the tag `latest` names, config.json beside it
    ours = safetensors_torch.load_file(out / "model.safetensors")
    reference = safetensors_torch.load_file(f"{checkpoint}.reference.safetensors")
    assert ours.keys() == reference.keys() and all(_same_bits(ours[k], reference[k]) for k in reference)
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "config.json", "generation_config.json"}
    _, info = LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # lists (transformers 4) or sets (5)


def test_no_optimizer_file_at_all_is_cg114_for_every_rank(zero, tmp_path, capsys) -> None:
    path, _ = _copy(zero, "z2-bf16", tmp_path)
    for optim in (path / "global_step1").glob("*_optim_states.pt"):
        optim.unlink()
    code, report = json_scan(capsys, str(path))
    assert code == 1 and codes(report, severity="error") == {"CG114"}
    assert sorted(f["path"].rsplit("/", 1)[1] for f in _errors(report)) == [
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"]


def test_the_reviewer_judges_a_push_that_replaces_the_weights_by_partitions(zero, standin: StandinHub,
                                                                           tmp_path) -> None:
    from hub_delivery import AppServer, make_reviewer

    path, _ = zero("z3-bf16")
    consolidated = tmp_path / "consolidated"
    assert _convert(path, consolidated) == 0
    first = standin.add_repo("org/run", _repo_files(consolidated))
    second = standin.add_commit("org/run", _repo_files(path), replace=True)  # model.safetensors gone
    service = AppServer(make_reviewer(tmp_path / "queue.sqlite3"))
    try:
        event = {"event": {"action": "update", "scope": "repo.content"},
                 "repo": {"type": "model", "name": "org/run", "id": "abc", "private": False,
                          "url": {"web": "https://hub/org/run", "api": "https://hub/api/models/org/run"},
                          "headSha": second, "owner": {"id": "o1"}},
                 "updatedRefs": [{"ref": "refs/heads/main", "oldSha": first, "newSha": second}],
                 "webhook": {"id": "w1", "version": 3}}
        assert service.post(event).status_code == 202
        assert service.reviewer.wait_idle(60)
    finally:
        service.stop()
    [discussion] = standin.repos["org/run"].discussions
    assert first[:12] in discussion.description  # the change since the previous head
    assert "CG121" in discussion.description and "**failed**" in discussion.description


def test_flipped_bytes_in_a_rank_file_give_findings_never_a_crash(zero, tmp_path, capsys) -> None:
    import random

    path, _ = _copy(zero, "z2-bf16", tmp_path)
    target = path / "global_step1" / "mp_rank_00_model_states.pt"
    original = target.read_bytes()
    rng = random.Random(30)
    for _ in range(24):
        data = bytearray(original)
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
        code, report = json_scan(capsys, str(path))
        assert code in (0, 1), at  # a finding (CG001 naming the file) or a file torch reads the same
        if code == 1:
            assert codes(report, severity="error") <= {"CG001", "CG114", "CG118"}, (at, report["findings"])


def test_diff_compares_two_zero_checkpoints_as_models_values_included(zero, capsys) -> None:
    bf16, _ = zero("z2-bf16")
    fp16, _ = zero("z2-fp16")
    capsys.readouterr()
    assert main(["diff", "--values", str(bf16 / "global_step1"), str(fp16 / "global_step1")]) == 0
    out = capsys.readouterr().out
    assert "only values changed" in out and "max abs" in out  # the masters' values, read from the partitions
    assert main(["diff", "--values", str(bf16 / "global_step1"), str(zero("z3-bf16")[0] / "global_step1")]) == 0
    assert "identical values" in capsys.readouterr().out  # ZeRO-2 and ZeRO-3 of one run: the same masters


def test_a_hub_scan_checks_latest_too(zero, standin: StandinHub) -> None:
    from guard.config import build_policy
    from guard.hub.client import HubClient
    from guard.hub.scan import scan_hub

    path, _ = zero("z2-bf16")
    files = _repo_files(path)
    standin.add_repo("org/good", files)
    standin.add_repo("org/bad", {**files, "latest": b"global_step9\n"})
    # no zero_to_fp32.py beside it: DeepSpeed's by the tag it names, as a local scan decides (latest_problem)
    standin.add_repo("org/noscript", {**{k: v for k, v in files.items() if k != "zero_to_fp32.py"},
                                      "latest": b"global_step9\n"})
    standin.add_repo("org/docs", {"latest": b"v2 of the docs\n"})  # a plain file named latest: no finding
    policy = build_policy({}, source=None, overrides={})
    result = scan_hub(["org/good", "org/bad", "org/noscript", "org/docs"], policy, HubClient(token="hf_bot"))
    found = sorted((f.code, f.path) for f in result.report.findings if f.code == "CG119")
    assert found == [("CG119", "org/bad/latest"), ("CG119", "org/noscript/latest")]
    assert not [f for f in result.report.findings if f.path.startswith("org/docs")]


@pytest.mark.parametrize("name", list(RUNS))
def test_our_partitions_agree_with_zero_to_fp32s_own_parse(zero, name: str) -> None:
    """What zero_to_fp32's parse_model_states / parse_optim_states made of the same files (in the writer's
    process: the test never imports DeepSpeed) against what our reader makes of them, file by file."""
    from guard.training.deepspeed.dirs import claim, read_ranks

    path, _ = zero(name)
    theirs = json.loads(Path(f"{path}.partitions.json").read_text())
    tag = path / "global_step1"
    found = claim(str(tag), frozenset(p.name for p in tag.iterdir()))
    assert found is not None
    ours = read_ranks(found, name=str(tag))
    assert not ours.findings
    models = [ours.models[rank] for rank in sorted(ours.models)]
    assert [Path(m.path).name for m in models] == theirs["model_files"]
    assert [[[[n, list(s)] for n, s in group] for group in m.param_shapes] for m in models] == theirs["param_shapes"]
    assert [sorted(n for n, _ in m.frozen_shapes) for m in models] == theirs["frozen"]
    assert [sorted(map(list, m.shared)) for m in models] == theirs["shared"]
    optims = [ours.optims[rank] for rank in sorted(ours.optims)]
    assert [Path(o.path).name for o in optims] == theirs["optim_files"]
    assert {o.stage for o in optims} == {theirs["stage"]} and {o.partition_count for o in optims} == {
        theirs["world_size"]}
    assert [[t.numel for t in o.masters] for o in optims] == theirs["flat"]  # each rank's flat partition per group
    paddings = optims[0].alignment_paddings
    assert (None if paddings is None else [list(p) for p in paddings]) == theirs["paddings"]


def test_mutated_rank_files_are_findings_never_crashes_hangs_or_imports(zero, tmp_path) -> None:
    """The fuzz machinery's byte mutations (tests/fuzz_inputs.py) of every rank file of a ZeRO-2 and a ZeRO-3
    save, read as a scan reads them: no exception, no hang, a small peak, nothing imported, and a refusal
    is CG001/CG003 naming the file."""
    import random
    import sys

    from bounds import no_hang, traced
    from fuzz_inputs import SCAN_PEAK_BYTES, apply_all, random_mutations

    from guard.readers import READ_FAILURES
    from guard.sources import BytesSource
    from guard.training.deepspeed.files import read_zero_file
    from guard.training.deepspeed.records import read_model_states, read_optim_states

    rng = random.Random(30)
    bases = [p for name in ("z2-bf16", "z3-bf16") for p in sorted((zero(name)[0] / "global_step1").glob("*.pt"))]
    read_zero_file(BytesSource(bases[0].read_bytes(), name=bases[0].name))  # its imports, before the count
    before = set(sys.modules)
    for i in range(120):
        base = bases[i % len(bases)]
        original = base.read_bytes()
        data = apply_all(original, random_mutations(rng, original, hot=min(len(original), 2000)))
        with traced() as peak, no_hang():
            try:
                zfile = read_zero_file(BytesSource(data, name=base.name))
                if not zfile.unsafe:
                    (read_model_states if "model_states" in base.name else read_optim_states)(zfile)
            except READ_FAILURES:
                pass  # CG001, as read_ranks reports it
        assert peak.bytes < SCAN_PEAK_BYTES + 2 * len(data), (base.name, peak.bytes)
    assert set(sys.modules) == before
