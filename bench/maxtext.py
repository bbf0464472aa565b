"""Benchmark: `ckpt-guard convert --to maxtext` of bench/convert.py's 1.48 GB bf16 Llama, against `cp`.

Whole processes on the same disk, alternating, wall time and peak RSS from os.wait4:

  cp:               cp model.safetensors X
  to maxtext:       ckpt-guard convert DIR --to maxtext --out X                 (unscanned)
  to maxtext scan:  ckpt-guard convert DIR --to maxtext --scan-layers --out X   (stacked per parameter)
  maxtext to torch: ckpt-guard convert X --to torch --out Y                     (the way back)

MaxText 0.2.5's own `to_maxtext` is timed by bench/maxtext_own.py: it fails at its save with orbax-checkpoint
0.12.8 (NoEntryError) and runs with the 0.12.4 its requirements allow (docs/benchmarks.md).

The model is written by bench/convert.py (`make_model`: LlamaConfig, random weights, 12 layers).

    python bench/maxtext.py [--rounds 3]        # the table in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_convert", ROOT / "bench" / "convert.py")
assert _spec is not None and _spec.loader is not None
convert_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert_bench)


def commands(src: Path, work: Path) -> dict[str, list[str]]:
    ours = [sys.executable, "-m", "guard", "convert"]
    cmds = {
        "cp": ["cp", str(src / "model.safetensors")],
        "to maxtext": [*ours, str(src), "--to", "maxtext", "--out"],
        "to maxtext --scan-layers": [*ours, str(src), "--to", "maxtext", "--scan-layers", "--out"],
        "maxtext to torch": [*ours, str(work / "ref-maxtext"), "--to", "torch", "--out"],
    }
    return cmds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    src = convert_bench.ensure_model(12)
    work = ROOT / "bench" / "out" / "maxtext"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    convert_bench.run_child([sys.executable, "-m", "guard", "convert", str(src), "--to", "maxtext", "--out",
                             str(work / "ref-maxtext")])
    cmds = commands(src, work)
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in cmds}
    for round_ in range(args.rounds):
        for index, (name, argv) in enumerate(cmds.items()):
            out = work / f"out-{round_}-{index}"
            runs[name].append(convert_bench.run_child([*argv, str(out)], ok_codes=(0, 1)))
            if out.is_file():  # cp's copy
                out.unlink()
            shutil.rmtree(out, ignore_errors=True)
    size = (src / "model.safetensors").stat().st_size
    cp_time = convert_bench.median_run(runs["cp"])[0]
    rows = ["| command | wall s | x cp | peak RSS MB |", "|---|---|---|---|"]
    for name, measured in runs.items():
        wall, rss = convert_bench.median_run(measured)
        rows.append(f"| {name} | {wall:.2f} | {wall / cp_time:.1f} | {rss / 2**20:.0f} |")
    table = "\n".join(rows)
    print(f"model: {size / 1e9:.2f} GB bf16, largest tensor {convert_bench.largest_tensor(src) / 2**20:.0f} MiB; "
          f"median of {args.rounds}\n{table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
