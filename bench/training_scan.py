"""Benchmark: the scan of a training checkpoint, by the number of items it holds (issue 30's second figure).

A tiny Llama (tests/deepspeed_writers.py's "tiny" sizes) with 8, 64 and 512 layers, trained one step and
saved by the trainers themselves:

  DCP:   torch.distributed.checkpoint.save({"model": ..., "optim": ...}) (the tutorial's layout, one process)
  ZeRO:  DeepSpeed 0.19.8, ZeRO-2, bf16, CPU, one rank (engine.save_checkpoint)

For each, in a child process that has imported guard and scanned once: the median of 7 timed
``discover_models`` + ``load_local_model`` calls (what `ckpt-guard scan` does before its rules), the bytes
read against the checkpoint's bytes, and the microseconds per item (DCP: the entries of torch's own
``.metadata``; ZeRO: the parameters in ``param_shapes``).  Linear: the per-item cost at the largest size over
the smallest's stays near 1 (the interpreter's start is not in these figures).

    python bench/training_scan.py [--layers 8 64 512] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
OUT = ROOT / "bench" / "out" / "training-scan"
HEADING = "## Scanning training checkpoints"

# the child: scan one checkpoint folder repeatedly, print the median time and the bytes read
CHILD = r"""
import json, statistics, sys, time
from guard.inventory import discover_models, load_local_model

path = sys.argv[1]

def scan():
    return [load_local_model(m) for m in discover_models([path])]

found = scan()
times = []
for _ in range(7):
    start = time.perf_counter()
    scan()
    times.append(time.perf_counter() - start)
files = [f for inv in found for f in inv.files]
print(json.dumps({"seconds": statistics.median(times), "read": sum(f.bytes_read for f in files),
                  "size": sum(f.size for f in files), "sets": len(found)}))
"""


def write_dcp(out: Path, layers: int) -> int:
    """What torch.distributed.checkpoint.save writes for the model and its AdamW state; its item count."""
    import torch
    import torch.distributed.checkpoint as dcp
    from deepspeed_writers import preset_sizes
    from transformers import LlamaConfig, LlamaForCausalLM

    if not (out / ".metadata").is_file():
        shutil.rmtree(out, ignore_errors=True)
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**preset_sizes(f"tiny-L{layers}"), tie_word_embeddings=False))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no process group: torch warns, then writes .metadata
            dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=str(out))
    return len(dcp.FileSystemReader(str(out)).read_metadata().state_dict_metadata)


def write_zero(out: Path, layers: int) -> int:
    import deepspeed_writers

    run = Path(f"{out}.run.json")
    if not run.is_file():
        shutil.rmtree(out, ignore_errors=True)
        deepspeed_writers.write_zero(out, stage=2, precision="bf16", preset=f"tiny-L{layers}", reference=False,
                                     timeout=1800)
    return len(json.loads(run.read_text())["names"])


def measure(path: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True,
                          cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows, per_item = [], {}
    for kind, write in (("DCP", write_dcp), ("ZeRO-2", write_zero)):
        for layers in args.layers:
            path = OUT / f"{kind.lower()}-L{layers}"
            items = write(path, layers)
            got = measure(path)
            cost = got["seconds"] / items * 1e6
            per_item.setdefault(kind, []).append(cost)
            rows.append(f"| {kind} | {layers} | {items:,} | {got['size'] / 1e6:.1f} MB | {got['read']:,} B "
                        f"({100 * got['read'] / got['size']:.2f} %) | {got['seconds'] * 1000:.1f} ms | {cost:.1f} us |")
            print(rows[-1], flush=True)
    linear = "; ".join(f"{kind}: {costs[-1] / costs[0]:.2f}" for kind, costs in per_item.items())
    print(f"per-item cost, largest over smallest: {linear}")
    if args.write_docs:
        write_docs(rows, linear, args.layers)
    return 0


def write_docs(rows: list[str], linear: str, layers: list[int]) -> None:
    section = "\n".join([
        HEADING, "",
        f"`python bench/training_scan.py --write-docs`: a tiny Llama with {', '.join(map(str, layers))} layers, "
        "trained one step and saved by `torch.distributed.checkpoint.save` (model and AdamW state) and by DeepSpeed "
        "0.19.8 (ZeRO-2, bf16, CPU); the scan (`discover_models` + `load_local_model`, what `ckpt-guard scan` runs "
        "before its rules) in a child that has imported guard and scanned once, median of 7.", "",
        "| checkpoint | layers | items | bytes | read | scan | per item |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows, "",
        f"Per-item cost at the largest size over the smallest (1.0 = linear): {linear}. Items: the entries of "
        "torch's own `.metadata` (DCP), the parameters in `param_shapes` (ZeRO).", "",
    ])
    docs = ROOT / "docs" / "benchmarks.md"
    text = docs.read_text()
    start = text.find(HEADING)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(HEADING))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    docs.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
