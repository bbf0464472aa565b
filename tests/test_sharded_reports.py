"""A sharded set's dtype finding: one CG101 for the set, whose fix names each shard once.

One finding per shard, each carrying the set's fix (every shard's name, three times), made the JSON
report quadratic in the shards: 166 MB at 1,000.  Shards are written as transformers writes them:
huggingface_hub's split of the state dict, safetensors' ``save_file``, and the index beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guard.cli import main

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
huggingface_hub = pytest.importorskip("huggingface_hub")

INDEX = "model.safetensors.index.json"


def sharded(directory: Path, dtypes: list[torch.dtype]) -> list[str]:
    """One 4x4 tensor a shard, in the given dtypes; the shard file names, in order."""
    directory.mkdir()
    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.full((4, 4), 0.5, dtype=dtype)
             for i, dtype in enumerate(dtypes)}
    split = huggingface_hub.split_torch_state_dict_into_shards(state, max_shard_size=32)  # one tensor a shard
    for filename, names in split.filename_to_tensors.items():
        safetensors_torch.save_file({name: state[name] for name in names}, str(directory / filename),
                                    metadata={"format": "pt"})
    index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    (directory / INDEX).write_text(json.dumps(index, indent=2), encoding="utf-8")
    return sorted(split.filename_to_tensors)


def scan_json(directory: Path, out: Path) -> dict:  # type: ignore[type-arg]
    assert main(["scan", "--expect", "fp32", "--format", "json", "-o", str(out), str(directory)]) == 1
    return json.loads(out.read_text(encoding="utf-8"))


def test_one_finding_for_the_set_and_a_report_linear_in_its_shards(tmp_path: Path) -> None:
    sizes = {}
    for count in (25, 50):
        shards = sharded(tmp_path / f"m{count}", [torch.bfloat16] * count)
        report = scan_json(tmp_path / f"m{count}", tmp_path / f"r{count}.json")
        sizes[count] = (tmp_path / f"r{count}.json").stat().st_size
        [finding] = [f for f in report["findings"] if f["code"] == "CG101"]
        assert Path(finding["path"]).name == shards[0] and finding["set"] == INDEX
        assert f"in all {count} files of the set are bf16" in finding["message"]
        fix = finding["fix"]
        assert fix["action"] == "set-cast" and fix["params"]["files"] == shards  # each shard once
        assert sorted(Path(w).name for w in fix["writes"]) == sorted([*shards, INDEX])
    # a fixed part plus a part per shard: doubling the shards at most doubles the report (quadratic: 4x)
    assert sizes[50] <= 2 * sizes[25], sizes


def test_the_finding_says_which_part_of_the_set_holds_the_dtype(tmp_path: Path) -> None:
    sharded(tmp_path / "m", [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16])
    weight_map = json.loads((tmp_path / "m" / INDEX).read_text(encoding="utf-8"))["weight_map"]
    first = min(weight_map[f"model.layers.{i}.mlp.up_proj.weight"] for i in (1, 3))  # the bf16 ones
    report = scan_json(tmp_path / "m", tmp_path / "r.json")
    [finding] = [f for f in report["findings"] if f["code"] == "CG101"]
    assert Path(finding["path"]).name == first and weight_map[finding["tensor"]] == first
    assert "2 floating tensor(s) (32 parameters) in 2 of the set's 4 files are bf16" in finding["message"]


def test_the_fix_plan_casts_every_shard(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shards = sharded(tmp_path / "m", [torch.bfloat16] * 12)
    capsys.readouterr()
    assert main(["fix", "--expect", "fp32", "--format", "json", "m"]) == 1
    [cast] = json.loads(capsys.readouterr().out)["extra"]["fix"]["plan"]
    assert cast["action"] == "set-cast" and cast["codes"] == ["CG101"] and cast["waiting_for"] == "--cast --replace"
    assert sorted(Path(w).name for w in cast["writes"]) == sorted([*shards, INDEX])
    assert main(["fix", "--expect", "fp32", "--write", "--cast", "--replace", "--no-backup", "m"]) == 0
    for shard in shards:
        with safetensors_torch.safe_open(str(tmp_path / "m" / shard), "pt") as handle:
            assert {handle.get_tensor(name).dtype for name in handle.keys()} == {torch.float32}, shard


@pytest.mark.parametrize("fmt", ["sarif", "github", "markdown"])
def test_the_json_report_gives_the_same_findings_through_every_reporter(
        fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sharded(tmp_path / "m", [torch.bfloat16] * 8)
    assert main(["scan", "--expect", "fp32", "--format", "json", "-o", "r.json", "m"]) == 1
    capsys.readouterr()
    assert main(["scan", "--expect", "fp32", "--format", fmt, "m"]) == 1
    direct = capsys.readouterr().out
    assert main(["report", "r.json", "--format", fmt]) == 1
    assert capsys.readouterr().out == direct and "CG101" in direct


def test_norms_in_half_precision_are_one_note_for_the_set(tmp_path: Path) -> None:
    """CG104 as CG101: one note for a sharded set, on its first file with a norm, with the count and spread."""
    directory = tmp_path / "m"
    directory.mkdir()
    state = {}
    for i in range(6):
        if i < 3:  # norms in the first layers' shards only
            state[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(4, dtype=torch.bfloat16)
        state[f"model.layers.{i}.mlp.up_proj.weight"] = torch.full((4, 4), 0.5, dtype=torch.bfloat16)
    split = huggingface_hub.split_torch_state_dict_into_shards(state, max_shard_size=40)
    for filename, names in split.filename_to_tensors.items():
        safetensors_torch.save_file({name: state[name] for name in names}, str(directory / filename),
                                    metadata={"format": "pt"})
    (directory / INDEX).write_text(json.dumps({"metadata": split.metadata, "weight_map": split.tensor_to_filename},
                                              indent=2), encoding="utf-8")
    holding = sorted({split.tensor_to_filename[n] for n in state if "layernorm" in n})
    assert len(holding) > 1 and len(holding) < len(split.filename_to_tensors)  # norms in some shards, not all
    assert main(["scan", "--expect", "bf16", "--format", "json", "-o", str(tmp_path / "r.json"), str(directory)]) == 0
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    [note] = [f for f in report["findings"] if f["code"] == "CG104"]
    assert Path(note["path"]).name == holding[0] and note["set"] == INDEX
    assert note["message"].startswith(f"3 normalization parameter(s) in {len(holding)} of the set's "
                                      f"{len(split.filename_to_tensors)} files stored in bf16; e.g. ")
    assert split.tensor_to_filename[note["tensor"]] == holding[0] and "layernorm" in note["tensor"]
