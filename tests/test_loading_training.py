"""Training checkpoints: a consolidation is judged against the table before `convert` publishes it (an
expert-parallel save that never gathered every expert is refused), and keep-fp32 modules held narrower
than fp32 in a training checkpoint's masters get the narrow-keep warning (CG126)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from scanning import codes, json_scan  # noqa: E402
from test_loading import save, tensors  # noqa: E402

from guard.cli import main  # noqa: E402


def dcp_checkpoint(root: Path, state: dict[str, torch.Tensor], config_from: Path) -> tuple[Path, Path]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: torch warns, then writes .metadata
        dcp.save({"model": state}, checkpoint_id=str(root / "ckpt"))
    return root / "ckpt", config_from / "config.json"


def test_missing_experts_are_not_published(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = save(tmp_path / "moe", "qwen3_moe")
    state = {k: v for k, v in tensors(saved).items() if not any(f".experts.{e}." in k for e in (2, 3))}
    ckpt, config = dcp_checkpoint(tmp_path, state, saved)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["convert", str(ckpt), "--to", "torch", "--out", str(out), "--config", str(config)]) == 1
    shown = capsys.readouterr().out
    assert "CG123" in shown and "experts 2–3 of 4 in layers 0–1" in shown
    assert not out.exists()  # nothing published


def test_whole_experts_are_published(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = save(tmp_path / "moe", "qwen3_moe")
    ckpt, config = dcp_checkpoint(tmp_path, tensors(saved), saved)
    out = tmp_path / "out"
    assert main(["convert", str(ckpt), "--to", "torch", "--out", str(out), "--config", str(config)]) == 0
    _, info = transformers.Qwen3MoeForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values())


def test_narrow_router_in_a_training_checkpoint_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """FSDP2 under a bf16 policy narrowed the keep-fp32 router in masters and model alike (Automodel#2143)."""
    saved = save(tmp_path / "ds", "deepseek_v3")
    state = {k: v.to(torch.bfloat16) for k, v in tensors(saved).items()}
    ckpt, _ = dcp_checkpoint(tmp_path, state, saved)
    (ckpt / "config.json").write_bytes((saved / "config.json").read_bytes())
    _, report = json_scan(capsys, str(ckpt))
    assert "CG126" in codes(report), report["findings"]
