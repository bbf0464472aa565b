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


def _fsdp2_deepseek_worker(rank: int, world: int, port: int, out: str, config_dir: str, narrowed: bool) -> None:
    """FSDP2 on a gloo mesh: the model cast to bf16 before sharding (its fp32 keeps too: the sharded parameters,
    which are the masters, and the model FSDP2 computes with are one bf16 copy), or kept in fp32 under
    ``MixedPrecisionPolicy(param_dtype=bf16)`` (bf16 only for the computation, never saved)."""
    import os

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same model on both ranks, built as dcp_writers builds its Llama (no loading threads)
        model = transformers.DeepseekV3ForCausalLM(transformers.AutoConfig.from_pretrained(config_dir))
        options: dict[str, object] = {"mesh": init_device_mesh("cpu", (world,))}
        if narrowed:
            model = model.to(torch.bfloat16)  # the router too: transformers' keep-fp32 undone (Automodel#2143)
        else:
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        for layer in model.model.layers:
            fully_shard(layer, **options)  # type: ignore[arg-type]  # the mesh and the policy, as FSDP2 takes them
        fully_shard(model, **options)  # type: ignore[arg-type]  # as above
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for parameter in model.parameters():  # a step's moments, in each parameter's dtype (no forward needed)
            parameter.grad = torch.full_like(parameter, 1e-3)
        optimizer.step()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=os.path.join(out, "ckpt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("narrowed", [True, False], ids=["cast-to-bf16", "mixed-precision-policy"])
def test_fsdp2_keeps_narrowed_in_its_masters_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  narrowed: bool) -> None:
    """A real FSDP2 checkpoint of DeepSeek-V3 (its router a strict fp32 keep), model and optimizer through
    ``get_state_dict``: cast to bf16 before sharding, the masters are bf16 and CG126 names the router; under
    a bf16 MixedPrecisionPolicy the masters stay fp32 (only the computation is bf16) and nothing is said."""
    import socket

    import torch.multiprocessing as mp

    saved = save(tmp_path / "ds", "deepseek_v3")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    mp.spawn(_fsdp2_deepseek_worker, args=(2, port, str(tmp_path), str(saved), narrowed), nprocs=2, join=True)
    ckpt = tmp_path / "ckpt"
    (ckpt / "config.json").write_bytes((saved / "config.json").read_bytes())
    _, report = json_scan(capsys, str(ckpt))
    [entry] = report["models"]
    [found] = entry["sets"]
    assert found["role"] == "training-state" and found["format"] == "dcp"
    keeps = [f for f in report["findings"] if f["code"] == "CG126"]
    if narrowed:
        assert keeps and "e_score_correction_bias" in keeps[0]["message"] + str(keeps[0].get("tensor")), keeps
        assert "stored in bf16" in keeps[0]["message"]
    else:
        assert not keeps, keeps
        assert {f["code"] for f in report["findings"]} & {"CG123", "CG124", "CG125"} == set()
