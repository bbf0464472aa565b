"""DeepSpeed ZeRO checkpoints written by DeepSpeed itself, on the CPU, in a process of their own.

DeepSpeed keeps global state (its accelerator, the process group, a JIT-built shm op) and imports
half of torch's distributed stack: each checkpoint is written by ``python tests/deepspeed_writers.py``
in a subprocess, so the test process never imports it.  The same process also writes DeepSpeed's own
consolidation (``zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``) as the reference the tests
compare ours with, and a ``run.json`` with what the model itself says (``num_parameters()``).

World size 1 runs in the writer process; world size 2 spawns two gloo ranks (torch.multiprocessing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DEEPSPEED_VERSION = "0.19.8"
HERE = Path(__file__).resolve()


def deepspeed_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


# Llama sizes: "tiny" for the tests (6,736 parameters), "175m" for bench/zero_consolidate.py (~174M).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=32),
    "175m": dict(vocab_size=32000, hidden_size=896, intermediate_size=2432, num_hidden_layers=12,
                 num_attention_heads=14, num_key_value_heads=14, max_position_embeddings=256),
}


def write_zero(root: Path, *, stage: int, precision: str = "bf16", world_size: int = 1, steps: int = 1,
               port: int = 29500, timeout: int = 600, preset: str = "tiny", reference: bool = True
               ) -> dict[str, object]:
    """``root/`` as ``engine.save_checkpoint(root)`` writes it (``latest``, ``global_stepN/``, the scripts),
    ``root/config.json`` (the model's config, beside it as the Trainer keeps it), and beside ``root``:
    ``<root>.reference.safetensors`` (zero_to_fp32's state dict) and ``<root>.run.json``."""
    # ATEN_CPU_CAPABILITY=default: torch's baseline kernels, the same on any x86-64 CPU.  Its vectorised ones may
    # round an element by where it falls in a vector (body or tail), and ZeRO-2 and ZeRO-3 cut the flat partitions
    # differently: on an AVX2 AMD EPYC the masters of one run differed by an ulp between the stages (max rel 7e-8);
    # with the baseline kernels they are identical, as the tests say ZeRO-2 and ZeRO-3 of one run are.
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "TOKENIZERS_PARALLELISM": "false", "ATEN_CPU_CAPABILITY": "default"}
    args = [sys.executable, str(HERE), str(root), str(stage), precision, str(world_size), str(steps), preset,
            "reference" if reference else "-"]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"DeepSpeed writer failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(Path(f"{root}.run.json").read_text())


def write_trainer_zero(root: Path, *, stage: int = 3, steps: int = 1, save_steps: int = 1, port: int = 29590,
                       timeout: int = 600) -> dict[str, object]:
    """``root/checkpoint-N/`` every ``save_steps`` up to ``steps`` as the Trainer writes them with DeepSpeed
    (bf16; ZeRO-3 without ``stage3_gather_16bit_weights_on_model_save``: no model.safetensors, only
    ``global_stepN/``; ZeRO-1/2: the bf16 ``model.safetensors`` beside it), and for each
    ``<root>/checkpoint-N.reference.safetensors`` (zero_to_fp32's state dict of it).  Returns the run.json of
    the last checkpoint; the arguments are ones transformers 4.57 and 5.x both take."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "USE_TF": "0",
           "USE_FLAX": "0", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(HERE), "trainer", str(root), str(stage), str(steps), str(save_steps)],
                          env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"Trainer with DeepSpeed failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads((root / f"checkpoint-{steps}.run.json").read_text())


def _trainer(root: str, stage: int, steps: int = 1, save_steps: int = 1) -> None:
    import torch
    from transformers import Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 2 * steps

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:  # a different batch each step: the masters move
            ids = torch.tensor([1 + i % 7, 2, 3 + i % 5, 4])
            return {"input_ids": ids, "labels": ids}

    model = _llama("tiny")
    config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
              "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": stage},
              "bf16": {"enabled": "auto"}, "zero_allow_untested_optimizer": True}
    args = TrainingArguments(root, max_steps=steps, save_steps=save_steps, per_device_train_batch_size=2,
                             report_to=[], use_cpu=True, bf16=True, deepspeed=config, disable_tqdm=True,
                             logging_strategy="no", learning_rate=1e-2)
    Trainer(model=model, args=args, train_dataset=Tokens()).train()
    for step in range(save_steps, steps + 1, save_steps):
        checkpoint = Path(root) / f"checkpoint-{step}"
        Path(f"{checkpoint}.run.json").write_text(json.dumps({
            "parameters": model.num_parameters(), "names": [n for n, _ in model.named_parameters()],
            "stage": stage}))
        _reference(str(checkpoint))


def _llama(preset: str):  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**preset_sizes(preset), tie_word_embeddings=False))


def preset_sizes(preset: str) -> dict[str, int]:
    """A preset's sizes; ``tiny-L<n>``: the tiny one with n layers (bench/training_scan.py's item counts)."""
    if preset.startswith("tiny-L"):
        return {**PRESETS["tiny"], "num_hidden_layers": int(preset[len("tiny-L"):])}
    return PRESETS[preset]


def fp16_on_any_cpu() -> None:
    """Let DeepSpeed run fp16 on a CPU whose oneDNN has no fp16 kernels (an AMD EPYC, most x86-64 CPUs).

    DeepSpeed 0.19.8's CPU accelerator answers ``is_fp16_supported()`` with oneDNN's
    ``torch.ops.mkldnn._is_mkldnn_fp16_supported()`` (true only on CPUs with AVX512-FP16 or AMX-FP16), and
    ``deepspeed.initialize`` then refuses an fp16 config: "Type fp16 is not supported on your device"; no
    environment variable changes the answer.  torch computes fp16 on any CPU without oneDNN (its own kernels,
    slower, the same format), and what the tests read is the checkpoint DeepSpeed writes, the same whichever
    kernels ran: so the writer says fp16 is supported, in its own process only."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    CPU_Accelerator.is_fp16_supported = lambda self: True  # type: ignore[method-assign]  # see above


def _train_and_save(rank: int, root: str, stage: int, precision: str, world_size: int, steps: int,
                    preset: str = "tiny") -> None:
    import deepspeed
    import torch

    if precision == "fp16":
        fp16_on_any_cpu()  # each rank: mp.spawn starts fresh processes
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    deepspeed.init_distributed("gloo")
    model = _llama(preset)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage}, precision: {"enabled": True}}
    if precision == "fp16":
        config["fp16"].update(initial_scale_power=8)  # a small scale: no overflow skips the first step
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        ids = torch.randint(0, 64, (1, 8), generator=generator)  # token ids every preset's vocabulary holds
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    engine.save_checkpoint(root)
    if rank == 0:
        model.config.save_pretrained(root)
        Path(f"{root}.run.json").write_text(json.dumps({
            "parameters": model.num_parameters(), "names": [n for n, _ in model.named_parameters()],
            "tag": f"global_step{steps}", "stage": stage, "precision": precision, "world_size": world_size}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _reference(root: str) -> None:
    from deepspeed.utils import zero_to_fp32
    from safetensors.torch import save_file

    state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(root)
    save_file({k: v.contiguous() for k, v in state.items()}, f"{root}.reference.safetensors")
    # zero_to_fp32's own parse of the rank files, for the agreement test (tests/test_training_zero.py)
    tag = os.path.join(root, Path(root, "latest").read_text().strip())
    models = zero_to_fp32.parse_model_states(zero_to_fp32.get_model_state_files(tag))
    stage, world, flat_groups, paddings = zero_to_fp32.parse_optim_states(zero_to_fp32.get_optim_files(tag), tag)
    Path(f"{root}.partitions.json").write_text(json.dumps({
        "model_files": [os.path.basename(f) for f in zero_to_fp32.get_model_state_files(tag)],
        "optim_files": [os.path.basename(f) for f in zero_to_fp32.get_optim_files(tag)],
        "param_shapes": [[[[n, list(s)] for n, s in group.items()] for group in m.param_shapes] for m in models],
        "frozen": [sorted(m.frozen_param_shapes or {}) for m in models],
        "shared": [sorted(map(list, m.shared_params)) for m in models],
        "buffers": [sorted(m.buffers) for m in models],
        "stage": stage, "world_size": world,
        "flat": [[int(g.numel()) for g in (groups if isinstance(groups, (list, tuple)) else [groups])]
                 for groups in flat_groups],
        "paddings": [list(map(int, p)) for p in paddings] if paddings else None}))


def main(argv: list[str]) -> int:
    if argv[0] == "trainer":
        _trainer(argv[1], *map(int, argv[2:5]))
        return 0
    root, stage, precision, world_size, steps = argv[0], int(argv[1]), argv[2], int(argv[3]), int(argv[4])
    preset, reference = argv[5], argv[6] == "reference"
    if world_size == 1:
        _train_and_save(0, root, stage, precision, world_size, steps, preset)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_train_and_save, args=(root, stage, precision, world_size, steps, preset), nprocs=world_size)
    if reference:
        _reference(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
