"""PyTorch Distributed Checkpoints written by torch itself on the CPU, for the DCP tests.

``save_plain``: ``dcp.save`` without a process group (the tutorial's ``{"model": ..., "optim": ...}``).
``save_fsdp2``: FSDP2 on a gloo mesh of 2 ranks (``torch.multiprocessing.spawn``), the model and the
optimizer through ``get_state_dict``, optionally under ``MixedPrecisionPolicy(param_dtype=bf16)``; the
model alone again through ``HuggingFaceStorageWriter(save_distributed=True)`` (also with
``enable_consolidation``: its own consolidated copy beside ``sharded/``) and without collectives
(``use_collectives=False``: each rank's own ``__R.metadata``).
The model is a tiny transformers Llama, seeded, so every writer's model is the same.
"""

from __future__ import annotations

import os
import socket
import warnings
from pathlib import Path
from typing import Any


def tiny_llama_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=False)


def tiny_llama() -> Any:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config())


def _train_step(model: Any, optimizer: Any) -> None:
    import torch

    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def save_plain(out: Path) -> Path:
    """The DCP tutorial's layout, one process, no process group (torch warns, then writes .metadata)."""
    import torch
    import torch.distributed.checkpoint as dcp

    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _train_step(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=str(out))
    tiny_llama_config().save_pretrained(out.parent / f"{out.name}-config")
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _fsdp_worker(rank: int, world: int, port: int, out: str, mixed: bool) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model = tiny_llama()
        options: dict[str, Any] = {"mesh": mesh}
        if mixed:
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        for layer in model.model.layers:
            fully_shard(layer, **options)
        fully_shard(model, **options)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        _train_step(model, optimizer)
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=os.path.join(out, "dcp"))
        if not mixed:
            dcp.save(model_state, storage_writer=HuggingFaceStorageWriter(os.path.join(out, "hf"),
                                                                           save_distributed=True))
            dcp.save({"model": model_state}, checkpoint_id=os.path.join(out, "per-rank"), use_collectives=False)
            dcp.save(model_state, storage_writer=HuggingFaceStorageWriter(
                os.path.join(out, "hf-consolidated"), save_distributed=True, enable_consolidation=True))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def save_fsdp2(out: Path, *, mixed: bool) -> Path:
    """``out/dcp`` (model and optimizer) and, without mixed precision, ``out/hf`` (the HF writer's shards) and
    ``out/per-rank`` (``__0.metadata``, ``__1.metadata``)."""
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_fsdp_worker, args=(2, _free_port(), str(out), mixed), nprocs=2, join=True)
    tiny_llama_config().save_pretrained(out / "config")
    return out


# torchtitan's Llama names for the HF ones (its state_dict_adapter's from_hf map), N the layer
_TORCHTITAN_NAMES = {
    "model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
    **{f"model.layers.N.{hf}.weight": f"layers.N.{tt}.weight" for hf, tt in (
        ("self_attn.q_proj", "attention.wq"), ("self_attn.k_proj", "attention.wk"),
        ("self_attn.v_proj", "attention.wv"), ("self_attn.o_proj", "attention.wo"),
        ("mlp.gate_proj", "feed_forward.w1"), ("mlp.down_proj", "feed_forward.w2"),
        ("mlp.up_proj", "feed_forward.w3"), ("input_layernorm", "attention_norm"),
        ("post_attention_layernorm", "ffn_norm"))},
}


def save_torchtitan_layout(out: Path) -> dict[str, Any]:
    """The tiny Llama as torchtitan checkpoints it (``checkpoint/step-N``): its own names at the top level,
    q/k rows in Meta's interleaved-RoPE order (torchtitan's ``from_hf``: view(heads, 2, rows // heads // 2, cols)
    then swap the middle axes), beside ``optimizer``, ``lr_scheduler``, ``dataloader`` and ``train_state``.
    Returns the HF state dict it came from."""
    import io
    import re

    import torch
    import torch.distributed.checkpoint as dcp

    config = tiny_llama_config()
    hf = tiny_llama().state_dict()
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    state: dict[str, Any] = {}
    for key, value in hf.items():
        layer = re.search(r"layers\.(\d+)\.", key)
        abstract = key.replace(f"layers.{layer.group(1)}.", "layers.N.") if layer else key
        name = _TORCHTITAN_NAMES[abstract].replace("N", layer.group(1)) if layer else _TORCHTITAN_NAMES[abstract]
        projection = next((p for p in heads if f".{p}." in key), None)
        if projection:
            rows, cols = value.shape
            n = heads[projection]
            value = value.view(n, 2, rows // n // 2, cols).transpose(1, 2).reshape(rows, cols).contiguous()
        state[name] = value
    state.update(optimizer={"state": {name: {"exp_avg": torch.zeros_like(v)} for name, v in state.items()}},
                 lr_scheduler={"last_epoch": 3}, dataloader=io.BytesIO(b"{}"), train_state=io.BytesIO(b"step=3"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(out))
    return hf
