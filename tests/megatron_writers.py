"""Megatron-core ``torch_dist`` checkpoints written by Megatron-core itself, on the CPU, in a process of their own.

Megatron-core keeps global state (its parallel groups, the RNG trackers) and imports much of torch's
distributed stack: each checkpoint is written by ``python tests/megatron_writers.py`` in a subprocess, so
the test process never imports it.  The writer builds a tiny Llama-like ``GPTModel`` (RMSNorm, SwiGLU,
grouped-query attention, untied output layer, RoPE) from Megatron's local layer spec on gloo (one rank, or
tensor parallelism over two spawned ranks: mode "fp32-tp2"), and saves ``{"model":
model.sharded_state_dict(), "args": ..., "iteration": 10}`` with ``dist_checkpointing.save`` (torch_dist)
into ``root/iter_0000010/`` beside ``latest_checkpointed_iteration.txt``, as
``megatron.training.checkpointing`` lays it out; the bf16 run (``Float16Module``) adds fp32 masters and
Adam moments after one step (``_optimizer_state``).  It also writes Megatron's own forward logits for
fixed tokens (``<root>.logits.npy``, fp32 runs), the HF Llama config.json of the same model
(``root/config.json``) and ``<root>.run.json`` (the parameter count Megatron's model says, one rank).

Megatron-core 0.16 saves on a CPU only after two patches (its torch_dist writer calls
``torch.cuda.synchronize`` and ``torch.cuda.current_device``): both are made here, in the writer process only.
Megatron-core 0.19 needs Python 3.12; the project's venv is 3.11, so 0.16.1 (its newest for 3.11) writes these.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MEGATRON_VERSION = "0.16.1"
HERE = Path(__file__).resolve()
ITERATION = 10
# the tiny Llama: 2 layers, hidden 16, 2 query heads in 1 group (GQA), SwiGLU 32, vocab 64
TINY = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32, rms_norm_eps=1e-6, rope_theta=10000.0)
TOKENS = [[3, 17, 42, 5, 9, 60, 1, 33]]
# "fp32-tp2": tensor parallelism over 2 gloo ranks, which needs query groups divisible by 2
TP2 = {**TINY, "num_attention_heads": 4, "num_key_value_heads": 2}
# "fp32-steps": iteration 10, one SGD step, iteration 20 beside it (the tracker names 20): two saves to diff
MODES = {"fp32": (TINY, 1), "bf16": (TINY, 1), "fp32-tp2": (TP2, 2),
         "fp32-steps": (TINY, 1)}  # mode -> (sizes, tensor-parallel ranks)
LATER = 20  # the second save's iteration in mode "fp32-steps"


def megatron_available() -> bool:
    import importlib.util

    try:  # find_spec imports the parent package: absent, that is ModuleNotFoundError, not None
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


def write_megatron(root: Path, *, mode: str = "fp32", timeout: int = 600) -> dict[str, object]:
    """``root/`` as Megatron's training loop saves iteration 10 (``latest_checkpointed_iteration.txt``,
    ``iter_0000010/``), ``root/config.json``; beside ``root``: ``<root>.logits.npy`` and ``<root>.run.json``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "USE_TF": "0", "TF_CPP_MIN_LOG_LEVEL": "3",
           "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(HERE), str(root), mode], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"Megatron writer failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(Path(f"{root}.run.json").read_text())


def _patch_for_cpu() -> None:
    """The two CUDA calls of Megatron-core 0.16's torch_dist save, made harmless on a CPU."""
    import torch

    torch.cuda.synchronize = lambda *a, **k: None  # filesystem_async.py, after the (CPU) tensor copies
    torch.cuda.current_device = lambda: "cpu"  # state_dict_saver.py, the device of its failure flag


def _model(dtype: str, sizes: dict):  # type: ignore[no-untyped-def]
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    params_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    config = TransformerConfig(
        num_layers=sizes["num_hidden_layers"], hidden_size=sizes["hidden_size"],
        num_attention_heads=sizes["num_attention_heads"], num_query_groups=sizes["num_key_value_heads"],
        ffn_hidden_size=sizes["intermediate_size"], normalization="RMSNorm", layernorm_epsilon=sizes["rms_norm_eps"],
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        use_cpu_initialization=True, params_dtype=params_dtype, bf16=dtype == "bf16",
        hidden_dropout=0.0, attention_dropout=0.0, apply_rope_fusion=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False, init_method_std=0.2)
    model = GPTModel(config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=sizes["vocab_size"],
                     max_sequence_length=sizes["max_position_embeddings"], position_embedding_type="rope",
                     rotary_base=int(sizes["rope_theta"]), share_embeddings_and_output_weights=False,
                     parallel_output=False)  # logits gathered over tensor-parallel ranks
    with torch.no_grad():  # RMSNorm weights start at 1: made distinct so a misplaced norm shows in the logits
        for name, param in model.named_parameters():
            if "layernorm" in name or "layer_norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, dtype=torch.float32).to(param.dtype))
    if dtype == "bf16":  # as megatron.training's get_model wraps it: every parameter bf16, norms too
        from megatron.core.transformer.module import Float16Module

        return Float16Module(config, model)
    return model


def _optimizer_state(model, model_state: dict) -> dict:  # type: ignore[no-untyped-def]
    """What ``Float16OptimizerWithFloat16Params.sharded_state_dict`` (megatron/core/optimizer/optimizer.py) makes
    of fp32 masters after an Adam step: the masters as ``optimizer.state.fp32_param.<key>``, the moments as
    ``optimizer.state.exp_avg.<key>`` (Megatron's own ``make_sharded_optimizer_tensor`` and
    ``optim_state_to_sharding_state``).  That class asserts CUDA tensors, so its steps are taken here: the bf16
    gradients of one forward/backward copied to the masters, ``torch.optim.Adam`` on them, the module weights
    set from the masters as its ``_copy_main_params_to_model_params`` does."""
    import torch
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        make_sharded_optimizer_tensor,
        optim_state_to_sharding_state,
    )

    params = [p for p in model.parameters() if p.requires_grad]
    tokens = torch.tensor(TOKENS)
    positions = torch.arange(tokens.shape[1]).unsqueeze(0)
    causal = torch.triu(torch.ones(1, 1, tokens.shape[1], tokens.shape[1], dtype=torch.bool), diagonal=1)
    model(tokens, positions, causal, labels=tokens).float().mean().backward()
    masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    for master, param in zip(masters, params):
        master.grad = param.grad.float()
    adam = torch.optim.Adam(masters, lr=1e-2)
    adam.step()
    with torch.no_grad():
        for master, param in zip(masters, params):
            param.copy_(master.to(param.dtype))
    by_id = get_param_id_to_sharded_param_map(model_state, params)
    optim = adam.state_dict()
    optim_state_to_sharding_state(optim, by_id, exclude_keys="step")
    fp32 = [[make_sharded_optimizer_tensor(by_id[i], master, prefix="optimizer.state.fp32_param")
             for i, master in enumerate(masters)]]
    return {"optimizer": optim, "fp32_from_fp16_params": fp32}


def _logits(model):  # type: ignore[no-untyped-def]
    import torch

    tokens = torch.tensor(TOKENS)
    positions = torch.arange(tokens.shape[1]).unsqueeze(0)
    causal = torch.triu(torch.ones(1, 1, tokens.shape[1], tokens.shape[1], dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        return model(tokens, positions, causal).float().numpy()


def main(root: Path, mode: str) -> None:
    import tempfile

    sizes, world = MODES[mode]
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as rendezvous:
        if world == 1:
            _write(0, root, mode, rendezvous)
        else:
            import torch.multiprocessing as mp

            mp.spawn(_write, args=(root, mode, rendezvous), nprocs=world, join=True)
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
          "torch_dtype": "bfloat16" if mode == "bf16" else "float32", **sizes}
    (root / "config.json").write_text(json.dumps(hf, indent=1))


def _write(rank: int, root: Path, mode: str, rendezvous: str) -> None:
    """One rank's save (rank 0 also writes the tracker, the logits and run.json)."""
    import argparse

    import numpy as np
    import torch
    import torch.distributed as dist

    _patch_for_cpu()
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    sizes, world = MODES[mode]
    dtype = mode.split("-")[0]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}/pg", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(world, 1)
    torch.manual_seed(0)  # each rank builds the whole weights on the CPU and keeps its slice: the same seed
    initialize_rng_tracker(inference_rng_tracker=True)  # its forks are no-ops: no CUDA RNG to fork on a CPU
    model = _model(dtype, sizes)
    params_dtype = next(model.parameters()).dtype
    iter_dir = root / f"iter_{ITERATION:07d}"
    iter_dir.mkdir(exist_ok=True)
    args = argparse.Namespace(params_dtype=params_dtype, iteration=ITERATION, tensor_model_parallel_size=world,
                              num_layers=sizes["num_hidden_layers"], hidden_size=sizes["hidden_size"])
    state = {"model": model.sharded_state_dict(), "args": args, "checkpoint_version": 3.0, "iteration": ITERATION}
    if dtype == "bf16":  # one Adam step on fp32 masters, saved as Megatron's optimizer saves them
        state["optimizer"] = _optimizer_state(model, state["model"])
    dist_checkpointing.save(state, str(iter_dir), sharded_strategy=("torch_dist", 1))
    dist.barrier()
    last = ITERATION
    if mode == "fp32-steps":  # one training step, then the save of a later iteration beside the first
        last = _save_after_a_step(model, root, args)
        dist.barrier()
    logits = _logits(model) if mode in ("fp32", "fp32-tp2") else None  # every rank joins the forward's collectives
    if rank == 0:
        (root / "latest_checkpointed_iteration.txt").write_text(str(last))
        if logits is not None:  # Megatron's own forward, the reference the converted model's logits are held to
            np.save(f"{root}.logits.npy", logits)
        local = sum(p.numel() for p in model.parameters())  # one rank's: the whole model where world is 1
        Path(f"{root}.run.json").write_text(json.dumps({"parameters": local if world == 1 else None,
                                                        "mode": mode, "megatron": MEGATRON_VERSION}))
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _save_after_a_step(model, root: Path, args) -> int:  # type: ignore[no-untyped-def]
    """One SGD step on the cross-entropy of ``TOKENS``, saved as iteration ``LATER`` in ``iter_0000020/``."""
    import torch
    from megatron.core import dist_checkpointing

    tokens = torch.tensor(TOKENS)
    positions = torch.arange(tokens.shape[1]).unsqueeze(0)
    causal = torch.triu(torch.ones(1, 1, tokens.shape[1], tokens.shape[1], dtype=torch.bool), diagonal=1)
    logits = model(tokens, positions, causal).float()  # Megatron's own loss path refuses a gathered output
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)).backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    args.iteration = LATER
    later = root / f"iter_{LATER:07d}"
    later.mkdir(exist_ok=True)
    state = {"model": model.sharded_state_dict(), "args": args, "checkpoint_version": 3.0, "iteration": LATER}
    dist_checkpointing.save(state, str(later), sharded_strategy=("torch_dist", 1))
    return LATER


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
