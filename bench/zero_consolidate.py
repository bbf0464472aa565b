"""Benchmark: consolidating a DeepSpeed ZeRO-2 bf16 checkpoint, `ckpt-guard convert` against `zero_to_fp32.py`.

A ~174M-parameter Llama (tests/deepspeed_writers.py's "175m" preset) trained one step by DeepSpeed 0.19.8
on the CPU (gloo, one rank) and saved with `engine.save_checkpoint`.  Then, alternating, whole processes:

  ckpt-guard:    python -m guard convert CKPT --to torch --out X           (fp32 masters -> model.safetensors)
  zero_to_fp32:  python CKPT/zero_to_fp32.py CKPT X --safe_serialization  (the script DeepSpeed saves beside it)

Each child's wall time and peak RSS come from os.wait4.  Targets (issue 30): time <= 1x and peak memory
<= 0.25x of zero_to_fp32; peak RSS <= 2x the largest tensor + 300 MB.  Both outputs are compared tensor by
tensor once, bit for bit.

    python bench/zero_consolidate.py [--rounds 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from convert import median_run, run_child  # noqa: E402  (bench/convert.py: os.wait4 per child)

CACHE = ROOT / "bench" / "out" / "zero-175m"


def checkpoint() -> tuple[Path, dict]:  # type: ignore[type-arg]
    import deepspeed_writers

    run = CACHE.parent / f"{CACHE.name}.run.json"
    if not run.is_file():
        shutil.rmtree(CACHE, ignore_errors=True)
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {CACHE} with DeepSpeed ...", flush=True)
        return CACHE, deepspeed_writers.write_zero(CACHE, stage=2, precision="bf16", preset="175m", reference=False,
                                                   timeout=3600)
    return CACHE, json.loads(run.read_text())


def largest_tensor(path: Path) -> int:
    """Bytes of the largest tensor of a safetensors file, from its header (no torch in this process: a child
    forked from a large parent would inherit its peak RSS, which Linux keeps across exec)."""
    with open(path, "rb") as fh:
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    return max(end - start for key, value in header.items() if key != "__metadata__"
               for start, end in [value["data_offsets"]])


SAME_BITS = """
import sys, torch
from safetensors import safe_open
with safe_open(sys.argv[1], "pt") as a, safe_open(sys.argv[2], "pt") as b:
    assert set(a.keys()) == set(b.keys()), "keys differ"
    for key in a.keys():
        x, y = a.get_tensor(key), b.get_tensor(key)
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(torch.uint8), y.view(torch.uint8)), key
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    ckpt, run = checkpoint()
    size = sum(p.stat().st_size for p in (ckpt / run["tag"]).iterdir())
    ours_runs, theirs_runs = [], []
    with tempfile.TemporaryDirectory(dir=ROOT / "bench" / "out") as tmp:
        for i in range(args.rounds):
            ours, theirs = Path(tmp) / f"ours{i}", Path(tmp) / f"theirs{i}"
            ours_runs.append(run_child([sys.executable, "-m", "guard", "convert", str(ckpt), "--to", "torch",
                                        "--out", str(ours)]))
            theirs_runs.append(run_child([sys.executable, str(ckpt / "zero_to_fp32.py"), str(ckpt), str(theirs),
                                          "--safe_serialization"]))
            if i == 0:
                shard = next(theirs.glob("*.safetensors"))
                run_child([sys.executable, "-c", SAME_BITS, str(ours / "model.safetensors"), str(shard)])
                largest = largest_tensor(ours / "model.safetensors")
            if i:
                shutil.rmtree(ours)
                shutil.rmtree(theirs)
    (t_ours, m_ours), (t_theirs, m_theirs) = median_run(ours_runs), median_run(theirs_runs)
    figures = {"parameters": run["parameters"], "checkpoint_bytes": size, "largest_tensor": largest,
               "rounds": args.rounds, "ours": [t_ours, m_ours], "zero_to_fp32": [t_theirs, m_theirs],
               "time_ratio": t_ours / t_theirs, "memory_ratio": m_ours / m_theirs,
               "memory_bound": 2 * largest + 300 * 2**20}
    print(f"ZeRO-2 bf16, {run['parameters']:,} parameters, {size / 1e9:.2f} GB of rank files "
          f"(largest fp32 tensor {largest / 2**20:.0f} MiB), median of {args.rounds}:")
    print(f"  ckpt-guard convert  {t_ours:6.2f} s  {m_ours / 2**20:7.0f} MiB")
    print(f"  zero_to_fp32.py     {t_theirs:6.2f} s  {m_theirs / 2**20:7.0f} MiB")
    print(f"  ratio               {figures['time_ratio']:6.2f}x   {figures['memory_ratio']:6.2f}x   "
          f"(bound 2x largest + 300 MB = {figures['memory_bound'] / 2**20:.0f} MiB)")
    if args.write_docs:
        write_docs(figures)
    return 0


def write_docs(f: dict) -> None:  # type: ignore[type-arg]
    """Replace (or add) the `## Consolidating ZeRO checkpoints` section of docs/benchmarks.md."""
    title = "## Consolidating ZeRO checkpoints"
    section = "\n".join([
        title, "",
        f"`python bench/zero_consolidate.py --rounds {f['rounds']} --write-docs`: a {f['parameters'] / 1e6:.0f}M-"
        f"parameter Llama trained one step by DeepSpeed 0.19.8 (ZeRO-2, bf16, CPU, one rank); "
        f"{f['checkpoint_bytes'] / 1e9:.2f} GB of rank files, largest fp32 tensor "
        f"{f['largest_tensor'] / 2**20:.0f} MiB. Medians of whole processes (os.wait4); "
        "both outputs equal bit for bit.",
        "",
        "| consolidation | wall | peak RSS |", "|---|---|---|",
        f"| `ckpt-guard convert CKPT --to torch` | {f['ours'][0]:.2f} s | {f['ours'][1] / 2**20:.0f} MiB |",
        f"| `zero_to_fp32.py CKPT OUT --safe_serialization` | {f['zero_to_fp32'][0]:.2f} s | "
        f"{f['zero_to_fp32'][1] / 2**20:.0f} MiB |",
        f"| ratio | {f['time_ratio']:.2f}x | {f['memory_ratio']:.2f}x |", "",
        "ckpt-guard reads each master from its byte ranges in the rank files when the writer asks for it, and "
        "never the moments; zero_to_fp32 loads every optimizer file (mmap) and builds the whole fp32 state "
        f"dict before it writes. Bound for ours: 2x the largest tensor + 300 MB = {f['memory_bound'] / 2**20:.0f} MiB.",
        "",
    ])
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text(encoding="utf-8")
    if title in text:
        start = text.index(title)
        end = text.find("\n## ", start + len(title))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
