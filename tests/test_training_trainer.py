"""The transformers Trainer with DeepSpeed ZeRO-2 (bf16, DS_ACCELERATOR=cpu), written by the Trainer itself:
four steps saved every two, so ``checkpoint-2/`` and ``checkpoint-4/``, each holding ``latest``,
``global_stepN/``, the bf16 ``model.safetensors`` that ``save_model`` gathers, ``config.json`` and the
Trainer's own state.  Read as what each file is, consolidated as ``zero_to_fp32`` does, and compared step
against step.  (ZeRO-3 without weights is tests/test_training_zero.py's Trainer test.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import deepspeed_writers  # noqa: E402
from scanning import codes, json_scan, model, sets_of  # noqa: E402

from guard.cli import main  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not deepspeed_writers.deepspeed_available(), reason="make test installs deepspeed")]

STEPS, SAVE_STEPS = 4, 2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("trainer") / "out"
    written = deepspeed_writers.write_trainer_zero(root, stage=2, steps=STEPS, save_steps=SAVE_STEPS, port=29700)
    return root, written


def _reference(root: Path, step: int) -> dict[str, torch.Tensor]:
    return safetensors_torch.load_file(root / f"checkpoint-{step}.reference.safetensors")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def test_the_trainer_wrote_a_checkpoint_every_save_steps_with_its_weights(run) -> None:
    root, _ = run
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["checkpoint-2", "checkpoint-4"]
    checkpoint = root / "checkpoint-4"
    assert (checkpoint / "latest").read_text().strip() == "global_step4"
    assert {"model.safetensors", "config.json", "trainer_state.json", "zero_to_fp32.py"} <= {
        p.name for p in checkpoint.iterdir()}


def test_each_checkpoint_is_read_as_an_expert_would(run, capsys) -> None:
    root, written = run
    checkpoint = root / "checkpoint-4"
    code, report = json_scan(capsys, str(checkpoint))
    training = model(report, "global_step4")
    (state,) = training["sets"]
    assert state["role"] == "training-state" and training["parameters"] == written["parameters"]
    assert set(training["dtypes"]) == {"F32"}  # what it would publish: the masters
    notes = " ".join(state["notes"])
    assert "ZeRO-2" in notes and "world size 1" in notes and "DeepSpeed 0.19.8" in notes
    assert "module weights bf16" in notes and "master weights fp32" in notes and "optimizer state fp32" in notes
    published = sets_of(report, "checkpoint-4")["model.safetensors"]
    assert published["primary"] and set(published["dtypes"]) == {"BF16"}
    assert published["parameters"] == written["parameters"]
    # The bf16 weights save_model gathered, beside fp32 masters: CG122 names the command that writes those;
    # training state in a model folder is CG120; the folder has weights, so no CG121.
    assert "CG122" in codes(report, severity="note") and codes(report, severity="warning") == {"CG120"}
    assert "CG121" not in codes(report) and "CG108" not in codes(report)  # `bf16_` names the run, not the file
    [cg122] = [f for f in report["findings"] if f["code"] == "CG122"]
    assert cg122["path"].endswith("checkpoint-4/model.safetensors") and "ckpt-guard convert" in cg122["message"]
    # DeepSpeed's pickled classes are inert: no CG003 on its files (training_args.bin's note is a true one)
    assert not [f for f in report["findings"] if f["code"] == "CG003" and "global_step" in f["path"]]
    assert codes(report, severity="error") == {"CG101"}  # the bf16 published copy under the default --expect fp32
    assert [f["path"] for f in report["findings"] if f["severity"] == "error"] == [
        str(checkpoint / "model.safetensors")]


def test_the_published_bf16_copy_is_the_masters_rounded(run) -> None:
    """What CG122 says, checked: model.safetensors is the fp32 masters cast to bf16, so narrower."""
    root, _ = run
    published = safetensors_torch.load_file(root / "checkpoint-4" / "model.safetensors")
    masters = _reference(root, 4)
    assert published.keys() == masters.keys()
    assert all(torch.equal(published[k], masters[k].to(torch.bfloat16)) for k in masters)
    assert any(not torch.equal(published[k].float(), masters[k]) for k in masters)


@pytest.mark.parametrize("step", [2, 4])
def test_convert_of_checkpoint_n_equals_zero_to_fp32_bit_for_bit(run, tmp_path, capsys, step: int) -> None:
    from transformers import LlamaForCausalLM

    root, written = run
    out = tmp_path / "out"
    assert main(["convert", str(root / f"checkpoint-{step}"), "--to", "torch", "--out", str(out)]) == 0
    ours = safetensors_torch.load_file(out / "model.safetensors")
    reference = _reference(root, step)
    assert ours.keys() == reference.keys() == set(written["names"])
    assert all(_same_bits(ours[k], reference[k]) for k in reference)  # the fp32 masters, not the bf16 copy
    assert not {"latest", "zero_to_fp32.py", "trainer_state.json", "global_step2", "global_step4"} & {
        p.name for p in out.iterdir()}
    _, info = LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_diff_compares_step_n_with_step_m_as_models_values_included(run, capsys) -> None:
    root, _ = run
    capsys.readouterr()
    old, new = root / "checkpoint-2", root / "checkpoint-4"
    assert main(["diff", "--values", "--format", "json", "--no-summary", str(old), str(new)]) == 0
    result = json.loads(capsys.readouterr().out)
    [pair] = [m for m in result["models"] if "global_step" in m["key"]]
    assert pair["key"] == "global_step2 -> global_step4" and pair["status"] == "changed"  # one model, two steps
    [masters] = pair["sets"]
    assert masters["old"]["dtypes"] == masters["new"]["dtypes"] == {"F32": 6736}
    assert not masters["added"] and not masters["removed"]
    before, after = _reference(root, 2), _reference(root, 4)
    changed = {t["name"]: t for t in masters["changed"]}
    assert changed.keys() == {k for k in after if not torch.equal(before[k], after[k])} and changed
    for name, tensor in changed.items():  # the masters' values, assembled from the partitions
        expected = (after[name].double() - before[name].double()).abs().max().item()
        assert tensor["kinds"] == ["values"] and tensor["max_abs"] == pytest.approx(expected, rel=1e-6)
    # CG120 at both steps is the same finding, matched across the tags
    assert not [f for f in result["introduced"] if f["code"] == "CG120"]
    assert main(["diff", "--values", "--no-summary", str(old), str(new)]) == 0
    assert "global_step2 -> global_step4: changed" in capsys.readouterr().out
