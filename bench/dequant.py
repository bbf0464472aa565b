"""Benchmark: `ckpt-guard convert --dequantize` against transformers' own way back to full precision.

The source is bench/convert.py's 1.48 GB bf16 Llama (12 layers, 0.74 B parameters), quantized by
transformers with ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")`` on CPU and saved
(untimed, once).  Then, as whole child processes (wall time and peak RSS from os.wait4):

  ours:         python -m guard convert SRC --to torch --dequantize --dtype bf16 --out X
  transformers: AutoModelForCausalLM.from_pretrained(SRC, dtype=bf16); model.dequantize(); save_pretrained(X)

Both write bf16 safetensors of the same tensors.  Targets: ours <= 0.5x transformers' time and <= 0.25x
its peak memory.  More cases plug into ``CASES``: name -> ``make(work: Path) -> Path`` that writes the
quantized source directory once (and returns it); every case runs both paths.

    python bench/dequant.py [--cases bnb-nf4] [--rounds 1]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from convert import ensure_model, load_average, run_child  # noqa: E402

OUT = ROOT / "bench" / "out" / "dequant"
QUANTIZE_BNB = """
import sys, torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
AutoModelForCausalLM.from_pretrained(sys.argv[1], quantization_config=q,
                                     dtype=torch.bfloat16).save_pretrained(sys.argv[2])
"""
THEIRS = """
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
model.dequantize()
model.save_pretrained(sys.argv[2])
"""


def make_bnb_nf4(work: Path) -> Path:
    """bench/convert.py's 12-layer bf16 Llama, quantized to nf4 by transformers + bitsandbytes (CPU)."""
    src = work / "llama-bnb-nf4"
    if not (src / "model.safetensors").is_file():
        print(f"quantizing into {src} ...", flush=True)
        subprocess.run([sys.executable, "-c", QUANTIZE_BNB, str(ensure_model(12)), str(src)], check=True)
    return src


from dequant_fp8 import REFERENCE as FP8_REFERENCE, make_fp8_block  # noqa: E402

# name -> the quantized source it benchmarks ("fp8-block": a DeepSeek-style block-scaled model)
CASES: dict[str, Callable[[Path], Path]] = {
    "bnb-nf4": make_bnb_nf4,
    "fp8-block": make_fp8_block,
}
# a case whose reference is not transformers' dequantize() (FP8 loads on GPUs only there): its own script
REFERENCES: dict[str, str] = {"fp8-block": FP8_REFERENCE}


def bench_case(name: str, rounds: int) -> dict[str, object]:
    src = CASES[name](OUT)
    out = OUT / "out"
    cmds = {"ours": [sys.executable, "-m", "guard", "convert", str(src), "--to", "torch", "--dequantize",
                     "--dtype", "bf16", "--out"],
            "transformers": [sys.executable, "-c", REFERENCES.get(name, THEIRS), str(src)]}
    runs: dict[str, list[tuple[float, int]]] = {k: [] for k in cmds}
    before = load_average()
    run_child(["sh", "-c", 'cat "$0"/*.safetensors > /dev/null', str(src)])  # the source warm in the page cache
    for _ in range(rounds):
        for key, argv in cmds.items():
            shutil.rmtree(out, ignore_errors=True)
            runs[key].append(run_child([*argv, str(out)]))
            wall, rss = runs[key][-1]
            print(f"{name:<10} {key:<13} {wall:8.2f} s  peak RSS {rss / 1e6:9.1f} MB", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    wall = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
    rss = {k: statistics.median(r[1] for r in v) for k, v in runs.items()}
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    print(f"{name}: source {size / 1e9:.2f} GB; ours {wall['ours']:.1f} s / {rss['ours'] / 1e6:.0f} MB, "
          f"transformers {wall['transformers']:.1f} s / {rss['transformers'] / 1e6:.0f} MB; ratios: time "
          f"{wall['ours'] / wall['transformers']:.3f}x (target <= 0.5), memory "
          f"{rss['ours'] / rss['transformers']:.3f}x (target <= 0.25); load average {before} -> {load_average()}")
    return {"wall": wall, "rss": rss, "bytes": size}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated: {', '.join(CASES)}")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in args.cases.split(","):
        bench_case(name, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
