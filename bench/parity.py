"""Benchmark and calibration of the parity smoke test (docs/parity.md).

  --sweep:  every paired class of tests/tiny_pairs.py (or those named with -k), saved by transformers
            in bf16 (or --dtype f16), converted by ckpt-guard, then `run_parity`: per output, Flax's
            max_rel against the PyTorch fp32 reference, PyTorch's own, and their ratio; and the fp32
            comparison's max_rel.  One JSON line per output in bench/out/parity/sweep-<dtype>.jsonl
            (appended per class, so the sweep runs in pieces: -k resnet, -k bert ...), then the
            distribution the factor and floor of guard.parity.relative are read from.
  --wall:   wall time of `ckpt-guard convert DIR --to flax --parity` on bench/convert.py's bf16
            Llama-style model (12 layers, 1.5 GB) against the conversion alone, whole processes,
            and the time of each of the four forward passes (in-process, one run).

    python bench/parity.py --sweep [--bases] [-k NAME ...] [--dtype bf16|f16]
    python bench/parity.py --summary [--dtype bf16|f16]
    python bench/parity.py --wall [--layers 12]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]
OUT = ROOT / "bench" / "out" / "parity"


def sweep(names: list[str], dtype: str, *, bases: bool) -> None:
    import torch
    import transformers
    from tiny_pairs import pairs, tiny_config

    from guard.cli import main as cli
    from guard.convert.map.families import ALIASES, FAMILIES
    from guard.parity.run import run_parity

    import jax.numpy as jnp
    from test_convert_families import old_clip

    jnp.clip = old_clip()  # the T5 family's Flax code calls jnp.clip(a_max=), gone from jax 0.10 (as in the tests)
    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / f"sweep-{dtype}.jsonl"
    chosen = [p for p in pairs() if (not names and not bases) or any(n.lower() in p[1].lower() for n in names)
              or (bases and p[1] == FAMILIES[ALIASES.get(p[0], p[0])].classes[0])]
    for model_type, pt_name, _flax_name in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "src", Path(tmp) / "flax"
            torch.manual_seed(0)
            model = getattr(transformers, pt_name)(tiny_config(model_type))
            model.to({"bf16": torch.bfloat16, "f16": torch.float16}[dtype]).save_pretrained(src)
            code = cli(["convert", str(src), "--to", "flax", "--out", str(out), "-f", "json",
                        "-o", str(Path(tmp) / "c.json")])
            start = time.perf_counter()
            findings, figures = run_parity(src, out)
            seconds = time.perf_counter() - start
        rows = outputs_of(figures, pt_name, dtype)
        verdict = [f"{f.code}:{f.severity.value}" for f in findings]
        print(f"{pt_name:<44} convert {code}  parity {seconds:5.1f}s  {verdict or 'passed'}", flush=True)
        with open(log, "a", encoding="utf-8") as fh:
            for row in rows or [{"class": pt_name, "dtype": dtype, "unavailable": figures.get("reason")}]:
                fh.write(json.dumps({**row, "findings": verdict}) + "\n")


def outputs_of(figures: dict[str, Any], pt_name: str, dtype: str) -> list[dict[str, Any]]:
    comps = {c["name"]: c for c in figures.get("comparisons", [])}
    low, fp32 = comps.get("flax vs fp32 reference"), comps.get("fp32")
    if low is None or fp32 is None:
        return []
    rows = []
    for name, fig in low["outputs"].items():
        rows.append({"class": pt_name, "dtype": dtype, "output": name, "flax": fig.get("max_rel"),
                     "own": fig.get("own_max_rel"), "ratio": fig.get("ratio"), "max_ref": fig.get("max_ref"),
                     "agreement": fig.get("agreement"), "own_agreement": fig.get("own_agreement"),
                     "top1": fig.get("top1_tie_aware"), "own_top1": fig.get("own_top1_tie_aware"),
                     "fp32": fp32["outputs"].get(name, {}).get("max_rel")})
    return rows


def summary(dtype: str) -> str:
    """The distribution of Flax/PyTorch error ratios, as docs/parity.md shows it."""
    rows = [json.loads(line) for line in (OUT / f"sweep-{dtype}.jsonl").read_text().splitlines()]
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:  # the last run of each class wins (the sweep appends)
        latest[(row["class"], row.get("output", ""))] = row
    rows = [r for r in latest.values() if "output" in r]
    continuous = [r for r in rows if r.get("agreement") is None]
    ratios = sorted(r["ratio"] for r in continuous if r["ratio"] is not None)
    zero_own = [r for r in continuous if r["ratio"] is None]
    lines = [f"{len({r['class'] for r in rows})} classes, {len(rows)} outputs ({dtype}); "
             f"{len(zero_own)} outputs where PyTorch's own error is 0 (largest Flax error there: "
             f"{max((r['flax'] for r in zero_own), default=0.0):.2e})"]
    if ratios:
        marks = [("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)]
        lines.append("ratio " + ", ".join(f"{k} {quantile(ratios, q):.3g}" for k, q in marks))
        edges = [0, 0.5, 0.9, 1.1, 2, 4, 8, 16, 64, 256, math.inf]
        for lo, hi in zip(edges, edges[1:]):
            n = sum(lo <= r < hi for r in ratios)
            if n:
                lines.append(f"  [{lo:g}, {hi:g}): {n}")
        worst = sorted((r for r in continuous if r["ratio"] is not None), key=lambda r: -r["ratio"])[:8]
        lines += [f"  worst: {r['class']} {r['output']} flax {r['flax']:.3g} own {r['own']:.3g} "
                  f"ratio {r['ratio']:.3g}" for r in worst]
    lines.append("fp32 comparison of these models: max max_rel "
                 f"{max((r['fp32'] or 0.0 for r in rows), default=0.0):.3g}")
    for r in rows:
        if r.get("agreement") is not None:
            lines.append(f"  discrete: {r['class']} {r['output']} agreement {r['agreement']:.3f} "
                         f"(PyTorch's own {r['own_agreement']:.3f})")
    return "\n".join(lines)


def quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def wall(layers: int) -> None:
    from convert import ensure_model, run_child

    src = ensure_model(layers)
    work = OUT / "wall"
    timings: dict[str, float] = {}
    for label, extra in (("convert", []), ("convert --parity", ["--parity"])):
        shutil.rmtree(work, ignore_errors=True)
        argv = [sys.executable, "-m", "guard", "convert", str(src), "--to", "flax", "--out", str(work), *extra]
        timings[label], rss = run_child(argv, ok_codes=(0, 1))
        print(f"{label:<18} {timings[label]:7.1f} s  peak RSS {rss / 2**30:.2f} GiB", flush=True)
    print(f"parity adds {timings['convert --parity'] - timings['convert']:.1f} s", flush=True)
    passes(src, work)
    shutil.rmtree(work, ignore_errors=True)


def passes(src: Path, flax_dir: Path) -> None:
    """Each forward pass timed in this process (load + run), through run_parity itself."""
    from guard.parity import run as parity_run
    from guard.parity import runs

    seen: list[tuple[str, float]] = []

    def timed(fn: Any, side: str) -> Any:
        def wrapper(cls: Any, directory: Path, dtype: str, inputs: dict[str, Any]) -> Any:
            start = time.perf_counter()
            try:
                return fn(cls, directory, dtype, inputs)
            finally:
                seen.append((f"{side}:{dtype}", time.perf_counter() - start))
        return wrapper

    runs.run_torch, runs.run_flax = timed(runs.run_torch, "torch"), timed(runs.run_flax, "flax")
    start = time.perf_counter()
    findings, _figures = parity_run.run_parity(src, flax_dir)
    total = time.perf_counter() - start
    print("passes: " + ", ".join(f"{k} {v:.1f} s" for k, v in seen) + f"; run_parity {total:.1f} s; "
          f"findings {[f.code for f in findings]}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--wall", action="store_true")
    parser.add_argument("-k", dest="names", action="append", default=[])
    parser.add_argument("--bases", action="store_true", help="each model_type's base class (and those of -k)")
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    if args.sweep:
        sweep(args.names, args.dtype, bases=args.bases)
    if args.sweep or args.summary:
        print(summary(args.dtype))
    if args.wall:
        wall(args.layers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
