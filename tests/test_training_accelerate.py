"""Accelerate's ``save_state`` with FSDP2 and SHARDED_STATE_DICT on a gloo mesh of 2, written by Accelerate
itself on the CPU (tests/accelerate_writers.py, which says the one flag it sets and why): read as
Accelerate's training state, consolidated bit for bit as Accelerate's own ``merge_fsdp_weights``, and
compared save against save; with ``mixed_precision="bf16"`` (MixedPrecisionPolicy) it is fp32 throughout; a
Hub scan of the save folder (loopback stand-in) says what the local upload gate says."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import accelerate_writers  # noqa: E402
from scanning import codes, json_scan, model  # noqa: E402

from guard.cli import main  # noqa: E402

pytestmark = pytest.mark.slow

ACCELERATE = "Accelerate (FSDP SHARDED_STATE_DICT) (dcp), world size 2"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("accelerate") / "run"
    return root, accelerate_writers.write_accelerate_fsdp2(root)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def test_accelerate_wrote_its_fsdp2_layout_and_would_not_pick_fsdp_on_a_cpu_itself(saved) -> None:
    root, run = saved
    # The writer's one flag: on a CPU Accelerate 1.15 chooses MULTI_CPU (DDP) and drops the FSDP plugin.  When
    # this fails, Accelerate runs FSDP on a CPU by itself and the flag in accelerate_writers.py can go.
    assert run["chosen"] == "MULTI_CPU" and run["prepared"] == "FSDPLlamaForCausalLM"
    step = root / "step-2"
    assert {p.name for p in step.iterdir()} == {"pytorch_model_fsdp_0", "optimizer_0", "random_states_0.pkl",
                                                "random_states_1.pkl"}
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert {p.name for p in (step / folder).iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp"}


def test_save_state_is_read_as_accelerates_training_state(saved, capsys) -> None:
    from guard.training.dcp.dirs import claim, scan

    root, run = saved
    step = root / "step-2"
    code, report = json_scan(capsys, str(step))
    assert code == 0 and not report["findings"]  # fp32 model weights; the optimizer folder is no CG007
    weights = model(report, "pytorch_model_fsdp_0")
    (state,) = weights["sets"]
    assert state["role"] == "training-state" and weights["parameters"] == run["parameters"]
    assert set(weights["dtypes"]) == {"F32"}
    notes = " ".join(state["notes"])
    assert ACCELERATE in notes and "module weights fp32 (21 tensors)" in notes
    # the model's own keys: Accelerate's `model.` container stripped (the HF keys keep their own `model.`)
    folder = step / "pytorch_model_fsdp_0"
    found = claim(str(folder), frozenset(p.name for p in folder.iterdir()))
    assert [t.name for t in scan(found, name=str(folder)).tensors] == run["names"]  # type: ignore[arg-type]
    optimizer = model(report, "optimizer_0")
    (moments,) = optimizer["sets"]
    notes = " ".join(moments["notes"])
    assert ACCELERATE in notes and "publishes no weights" in notes and optimizer["parameters"] == 0
    # exp_avg, exp_avg_sq and the step of each of the 21 parameters: the optimizer's role, fp32
    assert f"optimizer state fp32 ({3 * len(run['names'])} tensors)" in notes
    capsys.readouterr()
    assert main(["scan", "--no-summary", str(step)]) == 0
    text = capsys.readouterr().out
    assert "optimizer_0: Accelerate (FSDP SHARDED_STATE_DICT)" in text and "no weights: no model tensor" in text


@pytest.mark.parametrize("which", ["save folder", "model folder"])
def test_convert_equals_accelerates_merge_fsdp_weights(saved, tmp_path, which: str) -> None:
    from transformers import LlamaForCausalLM

    root, run = saved
    src = root / "step-2" if which == "save folder" else root / "step-2" / "pytorch_model_fsdp_0"
    out = tmp_path / "out"
    assert main(["convert", str(src), "--to", "torch", "--out", str(out),
                 "--config", str(root / "config" / "config.json")]) == 0
    ours = safetensors_torch.load_file(out / "model.safetensors")
    merged = safetensors_torch.load_file(root / "merged" / "model.safetensors")  # `accelerate merge-weights`
    assert ours.keys() == merged.keys() == set(run["names"])  # no optimizer, no `model.` container
    assert all(_same_bits(ours[k], merged[k]) for k in merged)
    _, info = LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_metadata_agrees_with_torchs_own_reader(saved) -> None:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from guard.training.dcp.layout import parse_metadata

    root, _ = saved
    dtypes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
        path = root / "step-2" / folder
        theirs = FileSystemReader(str(path)).read_metadata()
        ours = parse_metadata((path / ".metadata").read_bytes())
        assert [i.fqn for i in ours.items] == list(theirs.state_dict_metadata)
        for item in ours.items:
            meta = theirs.state_dict_metadata[item.fqn]
            assert item.path == tuple(map(str, theirs.planner_data[item.fqn]))  # list indices kept as text
            if isinstance(meta, BytesStorageMetadata):
                assert item.dtype is None and item.shape is None
                continue
            assert item.shape == tuple(meta.size) and item.dtype == dtypes[meta.properties.dtype]
            assert [(c.offsets, c.sizes) for c in item.chunks] == [(tuple(c.offsets), tuple(c.sizes))
                                                                  for c in meta.chunks]
        assert {(s.fqn, s.offset): (s.file, s.start, s.length) for s in ours.storage} == {
            (k.fqn, tuple(k.offset) if k.offset is not None else None): (v.relative_path, v.offset, v.length)
            for k, v in theirs.storage_data.items()}


def _model_of(folder: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(folder), str(tmp_path / f"{folder.parent.name}.pt"))
    return torch.load(tmp_path / f"{folder.parent.name}.pt", weights_only=True)["model"]


def test_diff_compares_two_saves_as_models_values_included(saved, tmp_path, capsys) -> None:
    root, _ = saved
    capsys.readouterr()
    assert main(["diff", "--values", "--format", "json", "--no-summary", str(root / "step-1"),
                 str(root / "step-2")]) == 0
    result = json.loads(capsys.readouterr().out)
    [pair] = [m for m in result["models"] if m["key"] == "pytorch_model_fsdp_0"]
    [weights] = pair["sets"]
    assert pair["status"] == "changed" and not weights["added"] and not weights["removed"]
    before = _model_of(root / "step-1" / "pytorch_model_fsdp_0", tmp_path)
    after = _model_of(root / "step-2" / "pytorch_model_fsdp_0", tmp_path)
    changed = {t["name"]: t for t in weights["changed"]}
    assert changed.keys() == {k for k in after if not torch.equal(before[k], after[k])} and changed
    for name, tensor in changed.items():  # each tensor assembled from both ranks' chunks
        expected = (after[name].double() - before[name].double()).abs().max().item()
        assert tensor["kinds"] == ["values"] and tensor["max_abs"] == pytest.approx(expected, rel=1e-6)


def test_a_missing_rank_is_cg114_and_convert_writes_nothing(saved, tmp_path, capsys) -> None:
    root, _ = saved
    step = Path(shutil.copytree(root / "step-2", tmp_path / "step-2"))
    (step / "pytorch_model_fsdp_0" / "__1_0.distcp").unlink()
    code, report = json_scan(capsys, str(step))
    assert code == 1 and codes(report, severity="error") == {"CG114"}
    assert all("pytorch_model_fsdp_0" in f["path"] for f in report["findings"] if f["code"] == "CG114")
    out = tmp_path / "out"
    assert main(["convert", str(step), "--to", "torch", "--out", str(out),
                 "--config", str(root / "config" / "config.json")]) != 0
    assert not out.exists()


@pytest.fixture(scope="module")
def bf16_saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The same run with ``Accelerator(mixed_precision="bf16")``: FSDP2's MixedPrecisionPolicy(param_dtype=bf16)."""
    root = tmp_path_factory.mktemp("accelerate") / "bf16"
    return root, accelerate_writers.write_accelerate_fsdp2(root, mixed_precision="bf16")


def test_bf16_mixed_precision_saves_fp32_parameters_and_moments_and_passes(bf16_saved, saved, tmp_path,
                                                                          capsys) -> None:
    """bf16 is FSDP2's compute dtype only: the sharded parameters and the AdamW moments stay fp32 and are saved
    so (torch's own reader says it).  The verdict: the module weights fp32, the optimizer state fp32, no
    finding; convert writes fp32 equal to Accelerate's merge_fsdp_weights bit for bit."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    root, run = bf16_saved
    assert run["mixed_precision"] == "bf16" and "param_dtype=torch.bfloat16" in run["policy"]
    step = root / "step-2"
    saved_dtypes = {folder: {m.properties.dtype for m in FileSystemReader(str(step / folder)).read_metadata()
                             .state_dict_metadata.values() if not isinstance(m, BytesStorageMetadata)}
                    for folder in ("pytorch_model_fsdp_0", "optimizer_0")}
    assert saved_dtypes == {"pytorch_model_fsdp_0": {torch.float32}, "optimizer_0": {torch.float32}}
    code, report = json_scan(capsys, str(step))
    assert code == 0 and not report["findings"]
    weights = model(report, "pytorch_model_fsdp_0")
    (state,) = weights["sets"]
    assert set(weights["dtypes"]) == {"F32"} and weights["parameters"] == run["parameters"]
    assert "module weights fp32 (21 tensors)" in " ".join(state["notes"])
    (moments,) = model(report, "optimizer_0")["sets"]
    assert f"optimizer state fp32 ({3 * len(run['names'])} tensors)" in " ".join(moments["notes"])
    out = tmp_path / "out"
    assert main(["convert", str(step), "--to", "torch", "--out", str(out),
                 "--config", str(root / "config" / "config.json")]) == 0
    ours = safetensors_torch.load_file(out / "model.safetensors")
    merged = safetensors_torch.load_file(root / "merged" / "model.safetensors")
    assert ours.keys() == merged.keys() and all(_same_bits(ours[k], merged[k]) for k in merged)
    assert {t.dtype for t in ours.values()} == {torch.float32}
    # bf16 compute took effect: the same seeds and batches trained in fp32 reached other weights
    fp32_merged = safetensors_torch.load_file(saved[0] / "merged" / "model.safetensors")
    assert any(not torch.equal(fp32_merged[k], merged[k]) for k in merged)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    from hub_standin import standin_fixture

    yield from standin_fixture(monkeypatch, tmp_path)


def test_a_hub_scan_reads_the_save_folder_as_the_upload_gate_does(saved, standin) -> None:
    """The save folder pushed to the loopback stand-in Hub: both DCP folders read by ranged reads (.metadata
    only, never a .distcp), with the same sets, parameter counts and findings as the local publishing scan."""
    from guard.config import build_policy
    from guard.hub.client import HubClient
    from guard.hub.scan import scan_hub
    from guard.scan import scan_paths

    root, run = saved
    step = root / "step-2"
    standin.add_repo("org/run", {p.relative_to(step).as_posix(): p.read_bytes()
                                 for p in sorted(step.rglob("*")) if p.is_file()})
    policy = build_policy({}, source=None, overrides={})
    remote = scan_hub(["org/run"], policy, HubClient(token="hf_bot"), publishing=True).report
    local = scan_paths([str(step)], policy, publishing=True)
    assert sorted((f.code, f.severity, f.path[len("org/run"):]) for f in remote.findings) == sorted(
        (f.code, f.severity, f.path[len(str(step)):]) for f in local.findings)
    assert {"CG120", "CG121"} <= {f.code for f in remote.findings} and "CG003" not in {f.code for f in remote.findings}
    assert {m.path[len("org/run"):]: m.parameters for m in remote.models} == {
        m.path[len(str(step)):]: m.parameters for m in local.models} == {
        "/optimizer_0": 0, "/pytorch_model_fsdp_0": run["parameters"]}
    files = {f["path"]: f for r in remote.extra["hub"]["repos"] for f in r["files"]}
    assert all(files[folder]["bytes"] < files[folder]["size"] for folder in ("optimizer_0", "pytorch_model_fsdp_0"))
