"""Training folders and modules: a real Trainer run, PEFT, sentence-transformers, Lightning."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import layouts  # noqa: E402
from scanning import codes, errors, json_scan, model, sets_of  # noqa: E402

pytestmark = pytest.mark.slow
DTYPE_RULES = {"CG101", "CG102", "CG103", "CG104", "CG105", "CG106", "CG107"}


@pytest.mark.parametrize("dtype,expect", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_trainer_checkpoints_are_the_model_not_its_optimizer(tmp_path: Path, capsys, dtype, expect) -> None:
    params = layouts.trainer_run(tmp_path / "out", dtype=dtype)
    code, report = json_scan(capsys, str(tmp_path / "out"), "--expect", expect, "--ignore", "CG104")
    assert code == 0 and not errors(report), errors(report)
    assert len(report["models"]) == 2
    for step in ("checkpoint-1", "checkpoint-2"):
        entry = model(report, step)
        assert entry["parameters"] == params
        assert set(entry["dtypes"]) == {"F32" if expect == "fp32" else "BF16"}  # no optimizer, no RNG bytes
        roles = {s["name"]: s["role"] for s in entry["sets"]}
        assert roles["model.safetensors"] == "weights"
        assert {roles[n] for n in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")} == {
            "training-state"}
    findings = report["findings"]
    assert not {f["code"] for f in findings if f["set"] != "model.safetensors"} & DTYPE_RULES
    notes = [f for f in findings if f["code"] == "CG003"]
    assert len(notes) == 2 and all(f["severity"] == "note" and f["path"].endswith("training_args.bin")
                                   and "TrainingArguments" in f["message"] for f in notes)


def test_a_hostile_global_in_training_state_stays_an_error(tmp_path: Path, capsys) -> None:
    import pickle
    import zipfile

    layouts.trainer_run(tmp_path / "out")
    target = tmp_path / "out" / "checkpoint-1" / "training_args.bin"

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (print, ("pwned",))

    with zipfile.ZipFile(target, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps(Payload(), protocol=2))
        zf.writestr("archive/version", "3\n")
    code, report = json_scan(capsys, str(target))
    found = [f for f in report["findings"] if f["code"] == "CG003"]
    assert code == 1 and found and all(f["severity"] == "error" for f in found)


def test_peft_adapter_follows_the_policy_and_fp32_is_normal_beside_bf16(tmp_path: Path, capsys) -> None:
    trainable = layouts.peft_lora(tmp_path / "lora")
    for expect in ("fp32", "bf16"):
        code, report = json_scan(capsys, str(tmp_path / "lora"), "--expect", expect)
        assert code == 0 and report["findings"] == []
        entry = model(report, "lora")
        assert entry["parameters"] == trainable
        assert [s["role"] for s in entry["sets"]] == ["adapter"]
    code, report = json_scan(capsys, str(tmp_path / "lora"), "--expect", "fp16")
    assert code == 0  # fp32 adapters are accepted under any expectation


def test_sentence_transformers_modules_are_models_of_their_own(tmp_path: Path, capsys) -> None:
    counts = layouts.sentence_transformer(tmp_path / "st")
    code, report = json_scan(capsys, str(tmp_path / "st"))
    assert code == 0 and report["findings"] == []
    assert model(report, "st")["parameters"] == counts["."]
    assert model(report, "2_Dense")["parameters"] == counts["2_Dense"]


def test_lightning_checkpoint_counts_weights_not_optimizer_states(tmp_path: Path, capsys) -> None:
    params = layouts.lightning_checkpoint(tmp_path / "pl")
    code, report = json_scan(capsys, str(tmp_path / "pl"))
    assert code == 0 and not errors(report)
    entry = model(report, "pl")
    assert entry["parameters"] == params
    assert sets_of(report, "pl")["last.ckpt"]["role"] == "weights"
    assert "CG102" not in codes(report)
