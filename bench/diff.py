"""Benchmark: `ckpt-guard diff` of two 20-shard models, against scanning both sides and `cat` of both.

One base model (Llama shapes from transformers' LlamaConfig on the meta device, random bf16 weights,
one decoder layer per shard: 20 shards and an index) and three changed copies of it:

- ``finetune``: layers 5-7 hold other values (three shards differ; the other 17 are byte-identical);
- ``copy``: a byte-identical copy (other inodes: no shortcut but the bytes);
- ``recast``: the same weights re-saved in fp32 (every tensor decoded: the worst case).

Targets (issue 24): `diff` without --values within 1.2x the cost of scanning the two sides; with
--values within 3x `cat` of both sides, or faster on byte-identical files.  Whole processes on a
warm page cache, alternating, medians; wall time and peak RSS from os.wait4.  The header figures
are also taken in-process (compare_sides against scan_inventories of both sides, interpreter
start-up and imports left out), since a whole process of either is mostly Python starting.

    python bench/diff.py [--rounds 5] [--write-docs]
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
OUT = ROOT / "bench" / "out" / "diff"
sys.path.insert(0, str(ROOT / "bench"))
import convert as convert_bench  # noqa: E402  (run_child, median_run)

CONFIG = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=20,
              num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048,
              tie_word_embeddings=False, dtype="bfloat16")
SHARDS = 20
FINETUNED_LAYERS = (5, 6, 7)


def layer_of(name: str) -> int:
    match = re.match(r"model\.layers\.(\d+)\.", name)
    if match:
        return int(match.group(1))
    return 0 if "embed_tokens" in name else SHARDS - 1  # the embeddings with the first layer, the head last


def write_model(directory: Path, *, dtype: str, seed_of: dict[int, int]) -> None:
    """One shard per layer, written a tensor at a time; ``seed_of`` gives a layer other values."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**CONFIG, architectures=["LlamaForCausalLM"])
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    directory.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    for shard in range(SHARDS):
        gen = torch.Generator().manual_seed(seed_of.get(shard, shard))
        names = [n for n in shapes if layer_of(n) == shard]
        file = f"model-{shard + 1:05d}-of-{SHARDS:05d}.safetensors"
        tensors = {n: (torch.randn(shapes[n], generator=gen) * 0.02).to(torch.bfloat16).to(torch_dtype)
                   for n in names}
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        weight_map.update((n, file) for n in names)
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config.dtype = "bfloat16" if dtype == "bf16" else "float32"
    config.save_pretrained(directory)


VARIANTS = {"base": ("bf16", {}), "finetune": ("bf16", {layer: 1000 + layer for layer in FINETUNED_LAYERS}),
            "recast": ("fp32", {})}


def ensure_models() -> dict[str, Path]:
    """Generated in child processes: a forked child's peak RSS starts at its parent's."""
    paths = {name: OUT / name for name in ("base", "finetune", "copy", "recast")}
    for name in VARIANTS:
        if not (paths[name] / "config.json").is_file():
            print(f"generating {name} ...", flush=True)
            subprocess.run([sys.executable, __file__, "--generate", name], check=True)
    if not (paths["copy"] / "config.json").is_file():
        shutil.copytree(paths["base"], paths["copy"])  # new inodes: the bytes are compared
    return paths


def weights(directory: Path) -> list[str]:
    return [str(p) for p in sorted(directory.glob("*.safetensors"))]


def guard(*args: str) -> list[str]:
    return [sys.executable, "-m", "guard", *args]


def in_process(old: Path, new: Path, rounds: int) -> dict[str, float]:
    """Median seconds of the header work alone: both scans, and the whole diff (which scans both)."""
    sys.path.insert(0, str(ROOT))
    from guard.config import Policy
    from guard.diff import compare_sides, local_side
    from guard.inventory import discover_models, load_local_model
    from guard.scan import scan_inventories

    def scan_both() -> None:
        for side in (old, new):
            scan_inventories([load_local_model(m) for m in discover_models([side])], Policy())

    def diff() -> None:
        compare_sides(local_side(old), local_side(new), Policy())

    times: dict[str, list[float]] = {"scan both (in-process)": [], "diff (in-process)": []}
    for _ in range(rounds):
        for name, fn in (("scan both (in-process)", scan_both), ("diff (in-process)", diff)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--generate", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--in-process", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=("finetune", "copy", "recast"), action="append")
    args = parser.parse_args()
    if args.in_process:
        old, new, rounds = args.in_process
        print(json.dumps(in_process(Path(old), Path(new), int(rounds))))
        return 0
    if args.generate:
        dtype, seeds = VARIANTS[args.generate]
        write_model(OUT / args.generate, dtype=dtype, seed_of=seeds)
        return 0
    paths = ensure_models()
    base = paths["base"]
    # Bytecode as an installed package has it: an environment that writes none (PYTHONDONTWRITEBYTECODE)
    # would compile every changed module on every run, and bill that to whichever command imports more.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(OUT / "pycache")
    rows = []
    for change in args.only or ("finetune", "copy", "recast"):
        new = paths[change]
        commands = {
            "cat both": ["cat", *weights(base), *weights(new)],
            "scan both": guard("scan", "--no-summary", "--expect", "bf16", "--format", "json", str(base), str(new)),
            "diff": guard("diff", "--no-summary", "--expect", "bf16", str(base), str(new)),
            "diff --values": guard("diff", "--no-summary", "--expect", "bf16", "--values", str(base), str(new)),
        }
        convert_bench.run_child(commands["cat both"])  # warm the page cache
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in commands}
        for i in range(args.rounds):
            for name, cmd in commands.items():
                runs[name].append(convert_bench.run_child(cmd, ok_codes=(0, 1)))
                wall, rss = runs[name][-1]
                print(f"{change} round {i + 1} {name:<14} {wall:6.3f} s  peak RSS {rss / 1e6:7.1f} MB", flush=True)
        medians = {name: convert_bench.median_run(r) for name, r in runs.items()}
        row = {"change": change, "bytes": sum(os.path.getsize(p) for p in weights(base) + weights(new)),
               **{name: {"wall_s": m[0], "peak_rss": m[1]} for name, m in medians.items()}}
        probe = subprocess.run([sys.executable, __file__, "--in-process", str(base), str(new), str(args.rounds)],
                               check=True, capture_output=True, text=True)  # apart: the parent stays small
        row.update(json.loads(probe.stdout.splitlines()[-1]))
        rows.append(row)
    print(json.dumps(rows, indent=2))
    if args.write_docs:
        write_docs(rows)
    return 0


def write_docs(rows: list[dict[str, object]]) -> None:
    lines = ["| change (both sides) | cat both | scan both | diff | diff / scan | in-process diff / scans "
             "| diff --values | --values / cat | peak RSS --values |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cat, scan, diff, values = (r[k]["wall_s"] for k in ("cat both", "scan both", "diff", "diff --values"))  # type: ignore[index]
        inproc = r["diff (in-process)"] / r["scan both (in-process)"]  # type: ignore[operator]
        lines.append(f"| {r['change']} ({int(r['bytes']) / 1e9:.2f} GB) | {cat:.3f} s | {scan:.3f} s | {diff:.3f} s "
                     f"| {diff / scan:.2f}x | {inproc:.2f}x | {values:.3f} s | {values / cat:.2f}x "
                     f"| {r['diff --values']['peak_rss'] / 1e6:.0f} MB |")  # type: ignore[index]
    table = "\n".join(lines)
    docs = ROOT / "docs" / "benchmarks.md"
    text = docs.read_text(encoding="utf-8")
    start, end = "<!-- bench/diff.py: start -->", "<!-- bench/diff.py: end -->"
    if start in text:
        head, rest = text.split(start, 1)
        text = head + start + "\n" + table + "\n" + end + rest.split(end, 1)[1]
        docs.write_text(text, encoding="utf-8")
    else:
        print("docs/benchmarks.md has no diff markers; the table:\n" + table)


if __name__ == "__main__":
    raise SystemExit(main())
