"""Accelerate's ``save_state`` with FSDP2 and ``SHARDED_STATE_DICT``, written by Accelerate on the CPU.

Two gloo ranks (torch.multiprocessing) each build ``Accelerator(cpu=True, fsdp_plugin=...)`` with
``FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")``, ``prepare`` the
tiny Llama and AdamW, train, and ``save_state`` twice (``step-1/``, ``step-2/``): each save folder holds
``pytorch_model_fsdp_0/`` (the model, keys ``model.*``), ``optimizer_0/`` (``optimizer.state.*``) and the
ranks' ``random_states_R.pkl``.  The parent then merges ``step-2`` with Accelerate's own
``merge_fsdp_weights`` (what ``accelerate merge-weights`` runs) as the reference.

Why one flag is set by hand: Accelerate 1.15 turns the FSDP plugin on only for accelerator devices.  On a
CPU, ``AcceleratorState`` picks ``DistributedType.MULTI_CPU`` (``state.py``: the branch that sets
``DistributedType.FSDP`` lists MULTI_GPU, MULTI_XPU, ... and not MULTI_CPU), drops the plugin without a
word, wraps the model in DDP and ``save_state`` writes ``model.safetensors`` + ``optimizer.bin``.  So each
rank records what Accelerate chose (``run.json``: ``"chosen"``, a test checks it is still MULTI_CPU) and
then sets ``distributed_type = FSDP`` and ``fsdp_plugin`` on the shared state; everything after that is
Accelerate's own code: ``fsdp2_prepare_model`` (``fully_shard`` on a gloo mesh), ``save_state`` ->
``save_fsdp_model`` / ``save_fsdp_optimizer`` (``torch.distributed.checkpoint.save``).
Run in a subprocess of its own, as the DeepSpeed writers are: the test process never imports Accelerate's
global state.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
SAVES = ("step-1", "step-2")


def write_accelerate_fsdp2(root: Path, *, mixed_precision: str = "no", timeout: int = 600) -> dict[str, object]:
    """``root/step-1/``, ``root/step-2/`` (save_state), ``root/merged/model.safetensors`` (merge_fsdp_weights
    of step-2), ``root/config/config.json``; returns ``root/run.json``.  ``mixed_precision``: Accelerator's
    (``"bf16"``: FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)``, as Accelerate makes it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "USE_TF": "0", "USE_FLAX": "0"}
    proc = subprocess.run([sys.executable, str(HERE), str(root), mixed_precision], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"Accelerate writer failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads((root / "run.json").read_text())  # type: ignore[no-any-return]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(rank: int, world: int, port: int, root: str, mixed_precision: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from dcp_writers import tiny_llama

    torch.set_num_threads(1)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT",
                                            auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin, mixed_precision=mixed_precision)
    chosen = accelerator.distributed_type
    PartialState().distributed_type = DistributedType.FSDP  # the one flag; see the module docstring
    accelerator.state.distributed_type = DistributedType.FSDP
    if accelerator.mixed_precision != "no":  # what AcceleratorState's FSDP branch does with the flag it sets
        plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.fsdp_plugin = plugin
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(1 + rank)
    for save in SAVES:
        ids = torch.randint(0, 64, (2, 8), generator=generator)
        accelerator.backward(model(input_ids=ids, labels=ids).loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.save_state(os.path.join(root, save))
    if rank == 0:
        Path(root, "rank0.json").write_text(json.dumps({
            "chosen": chosen.value if hasattr(chosen, "value") else str(chosen),
            "prepared": type(model).__name__, "mixed_precision": accelerator.mixed_precision,
            "policy": str(plugin.mixed_precision_policy)}))
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


def main(root: str, mixed_precision: str = "no") -> int:
    import torch.multiprocessing as mp

    sys.path.insert(0, str(HERE.parent))
    Path(root).mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank, args=(2, _free_port(), root, mixed_precision), nprocs=2, join=True)

    from accelerate.utils import merge_fsdp_weights
    from dcp_writers import tiny_llama, tiny_llama_config

    merge_fsdp_weights(os.path.join(root, "step-2", "pytorch_model_fsdp_0"), os.path.join(root, "merged"))
    tiny_llama_config().save_pretrained(os.path.join(root, "config"))
    model = tiny_llama()
    Path(root, "run.json").write_text(json.dumps({
        **json.loads(Path(root, "rank0.json").read_text()), "world_size": 2,
        "parameters": model.num_parameters(), "names": [n for n, _ in model.named_parameters()]}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    raise SystemExit(main(sys.argv[1], *sys.argv[2:3]))
