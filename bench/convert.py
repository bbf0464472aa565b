"""Benchmark: `ckpt-guard convert --to flax` vs transformers' own PyTorch -> Flax path.

A ~1.5 GB bf16 Llama-style model (transformers LlamaConfig, random weights) is written
straight into model.safetensors, tensor by tensor.  Then, alternating, whole processes:

  ours:   ckpt-guard convert DIR --to flax --out X
  theirs: FlaxLlamaForCausalLM.from_pretrained(DIR, from_pt=True, dtype=jnp.bfloat16).save_pretrained(X)

Each child's wall time and peak RSS come from os.wait4 (its own rusage).  Targets:
peak memory <= 1/4 and wall time <= 1/2 of transformers'.

    python bench/convert.py [--rounds 2] [--work bench/out/convert] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5504, num_hidden_layers=12,
              num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048,
              tie_word_embeddings=False, torch_dtype="bfloat16")
THEIRS = """
import sys, jax.numpy as jnp
from transformers import FlaxLlamaForCausalLM
FlaxLlamaForCausalLM.from_pretrained(sys.argv[1], from_pt=True, dtype=jnp.bfloat16).save_pretrained(sys.argv[2])
"""


def make_model(directory: Path) -> int:
    """Random bf16 weights written one tensor at a time (never the whole model in memory twice)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from guard.convert.io_torch import safetensors_header

    config = LlamaConfig(**CONFIG, architectures=["LlamaForCausalLM"])
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    directory.mkdir(parents=True, exist_ok=True)
    entries = [(name, "BF16", shape) for name, shape in shapes.items()]
    gen = torch.Generator().manual_seed(0)
    with open(directory / "model.safetensors", "wb") as fh:
        fh.write(safetensors_header(entries, {"format": "pt"}))
        for _name, _code, shape in entries:
            t = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            fh.write(t.view(torch.uint8).numpy().tobytes())
    config.save_pretrained(directory)
    GenerationConfig.from_model_config(config).save_pretrained(directory)
    return (directory / "model.safetensors").stat().st_size


def run_child(argv: list[str], *, ok_codes: tuple[int, ...] = (0,),
              stdout: int | None = subprocess.DEVNULL) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one child process (also used by bench/values.py)."""
    env = {**os.environ, "CI": "true", "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu"}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) not in ok_codes:
        raise SystemExit(f"{argv[:4]} failed:\n{err[-2000:]}")
    return wall, usage.ru_maxrss * 1024  # Linux reports KiB


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "out" / "convert")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    src = args.work / "llama-bf16"
    if not (src / "model.safetensors").is_file():
        print(f"generating {src} ...", flush=True)
        make_model(src)
    size = (src / "model.safetensors").stat().st_size
    ours_cmd = [sys.executable, "-m", "guard", "convert", str(src), "--to", "flax", "--out"]
    theirs_cmd = [sys.executable, "-c", THEIRS, str(src)]
    results: dict[str, list[tuple[float, int]]] = {"ckpt-guard": [], "transformers": []}
    for i in range(args.rounds):
        for label, cmd in (("ckpt-guard", ours_cmd), ("transformers", theirs_cmd)):
            out = args.work / f"out-{label}-{i}"
            shutil.rmtree(out, ignore_errors=True)
            wall, rss = run_child([*cmd, str(out)])
            results[label].append((wall, rss))
            print(f"round {i + 1} {label:<13} {wall:7.1f} s  peak RSS {rss / 1e9:6.2f} GB", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    ours = median_run(results["ckpt-guard"])
    theirs = median_run(results["transformers"])
    figures = {"model_bytes": size, "rounds": args.rounds, "ckpt_guard": ours, "transformers": theirs,
               "memory_ratio": ours[1] / theirs[1], "time_ratio": ours[0] / theirs[0],
               "cpus": os.cpu_count()}
    print(json.dumps(figures, indent=2))
    if args.write_docs:
        write_docs(figures)
    return 0


def median_run(runs: list[tuple[float, int]]) -> tuple[float, int]:
    return statistics.median(r[0] for r in runs), int(statistics.median(r[1] for r in runs))


def write_docs(f: dict) -> None:  # type: ignore[type-arg]
    """Replace (or add) the `## Conversion` section of docs/benchmarks.md, leaving the others alone."""
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    (ours_s, ours_rss), (th_s, th_rss) = f["ckpt_guard"], f["transformers"]
    section = (
        "## Conversion\n\n"
        f"`python bench/convert.py --rounds {f['rounds']} --write-docs`: a {f['model_bytes'] / 1e9:.2f} GB bf16 "
        "Llama-style model (LlamaConfig hidden 2048, 12 layers, vocab 32000; random weights, one "
        "model.safetensors) converted to Flax msgpack. Whole processes, alternating; median of the rounds; "
        f"peak RSS from each child's own rusage; {f['cpus']} CPUs (the alternation keeps the "
        "ratio fair if the machine's load drifts).\n\n"
        "| path | wall time | peak RSS |\n|---|---|---|\n"
        f"| `ckpt-guard convert DIR --to flax --out X` | {ours_s:.1f} s | {ours_rss / 1e9:.2f} GB |\n"
        f"| `FlaxLlamaForCausalLM.from_pretrained(DIR, from_pt=True, dtype=jnp.bfloat16).save_pretrained(X)` "
        f"| {th_s:.1f} s | {th_rss / 1e9:.2f} GB |\n"
        f"| ratio (target: memory <= 0.25, time <= 0.5) | {f['time_ratio']:.2f} | {f['memory_ratio']:.2f} |\n\n"
        "ckpt-guard reads one tensor at a time by byte range and writes it straight into the msgpack "
        "stream, so its peak is the interpreter and imports plus about two copies of the largest tensor "
        "(a Linear kernel and its transpose), not the model. Its output is bit-exact bf16; transformers' path "
        "bridges bf16 through fp32 while converting.\n\n"
    )
    pattern = re.compile(r"^## Conversion\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


if __name__ == "__main__":
    raise SystemExit(main())
