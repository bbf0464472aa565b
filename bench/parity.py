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
  --memory: peak RSS and wall time of `ckpt-guard parity` and `convert --parity` on bench/convert.py's
            bf16 Llamas (12 and 24 layers, 1.5 and 2.7 GB) against the transformers path (PyTorch
            from_pretrained, Flax from_pretrained(from_pt=True), one forward each) on the 12-layer
            one, whole processes in the same run; the ratios the issue sets (<= 0.5x memory,
            <= 1x time, 24 layers within 1.25x of 12).
  --deep:   the 70B-class simulation: a deep, narrow Llama with a 70B's proportions (GQA 8:1, MLP
            3.5x, 128k vocabulary) at 12, 24 and 48 layers; peak RSS of `ckpt-guard parity` each.
  --wide:   the other half: a Llama with a 70B's width (hidden 8192, MLP 28672, 64 heads, 8 KV heads,
            128k vocabulary, untied head) at 1 and 2 layers, so its largest units (vocabulary matrices,
            one block) are a 70B's own; `--width half` (hidden 4096, MLP 14336, 32 heads) first, as the
            basis for deciding whether the full width fits the machine.  Peak RSS of `ckpt-guard parity`.

    python bench/parity.py --sweep [--bases] [-k NAME ...] [--dtype bf16|f16]
    python bench/parity.py --summary [--dtype bf16|f16]
    python bench/parity.py --wall [--layers 12]
    python bench/parity.py --memory [--layers 12,24]
    python bench/parity.py --deep [--layers 12,24,48]
    python bench/parity.py --wide [--width half|full] [--layers 1,2] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]
OUT = ROOT / "bench" / "out" / "parity"


def sweep(names: list[str], dtype: str, *, bases: bool) -> None:
    import jax.numpy as jnp
    import torch
    import transformers
    from test_convert_families import old_clip
    from tiny_pairs import pairs, tiny_config

    from guard.cli import main as cli
    from guard.convert.map.families import ALIASES, FAMILIES
    from guard.parity.run import run_parity

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
    from guard.parity import run as parity_run, runs

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


THEIRS = """
import sys, numpy as np, torch, jax.numpy as jnp
from transformers import FlaxLlamaForCausalLM, LlamaForCausalLM
ids = np.random.default_rng(0).integers(3, 32000, (2, 16))
pt = LlamaForCausalLM.from_pretrained(sys.argv[1])
with torch.no_grad():
    a = pt(input_ids=torch.from_numpy(ids)).logits.float().numpy()
flax = FlaxLlamaForCausalLM.from_pretrained(sys.argv[1], from_pt=True)
b = np.asarray(flax(ids.astype(np.int32)).logits, dtype=np.float32)
print(float(np.abs(a - b).max()))
"""
# the deep, narrow stand-in for a 70B Llama: its proportions (GQA 64:8, MLP 28672/8192, 128k vocabulary)
NARROW = dict(vocab_size=128256, hidden_size=512, intermediate_size=1792, num_attention_heads=8,
              num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=False,
              rms_norm_eps=1e-5, torch_dtype="bfloat16")
LLAMA_70B = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                 num_key_value_heads=8, num_hidden_layers=80)
# a 70B's width at a few layers: its largest units at their real size (full), or at half the width
WIDE = {
    "full": dict(NARROW, hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8),
    "half": dict(NARROW, hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8),
}
SHAPES = {"narrow": NARROW, **{f"wide-{k}": v for k, v in WIDE.items()}}


def flax_python() -> str:
    """Where transformers' Flax classes are: this Python under transformers 4, else the transformers-4
    environment `make test` builds (.venv-tf4), where parity's Flax side runs too."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        return sys.executable
    from legacy_env import legacy_python

    return str(legacy_python())


def run_tree(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and the peak of the summed RSS of the child and its descendants (parity's Flax-side
    worker runs beside its parent, which keeps its own memory meanwhile), sampled every 20 ms; at least the
    child's own rusage peak."""
    import os
    import threading

    from convert import run_child

    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _tree_rss(os.getpid()))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        wall, own = run_child(argv)
    finally:
        done.set()
        thread.join()
    return wall, max(own, peak[0])


def _tree_rss(root: int) -> int:
    """The RSS (bytes) of every descendant of ``root`` (not ``root`` itself: the bench's own memory)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            parents[int(entry.name)], rss[int(entry.name)] = int(fields[1]), int(fields[21]) * 4096
        except (OSError, ValueError, IndexError):
            continue
    total, frontier = 0, [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        total += sum(rss[pid] for pid in children)
        frontier = children
    return total


def memory(layers: list[int], rounds: int, theirs_layers: int = 12) -> None:
    """Whole processes, alternating, after one untimed import of the libraries (the first process
    after a pause pays the page cache for torch, jax and transformers); the median of ``rounds``.
    Under transformers 5, parity's Flax side runs in the transformers-4 worker and the transformers path
    (which needs FlaxLlamaForCausalLM) in that environment; memory is the process tree's."""
    from convert import ensure_model, load_average, median_run, run_child

    theirs_python = flax_python()
    sources = {n: ensure_model(n) for n in layers}
    flaxes = {n: converted(src, OUT / f"llama-bf16-{n}l-flax") for n, src in sources.items()}
    run_child([sys.executable, "-c", "import torch, jax, flax, transformers"])
    run_child([theirs_python, "-c", "import torch, jax, flax, transformers"])
    print(f"ckpt-guard: {sys.executable}; transformers path: {theirs_python}", flush=True)
    print(f"load average before: {load_average()}", flush=True)
    samples: dict[str, list[tuple[float, int]]] = {}
    work = OUT / "memory-convert"
    for _ in range(rounds):
        for n, src in sources.items():
            samples.setdefault(f"parity {n}l", []).append(
                run_tree([sys.executable, "-m", "guard", "parity", str(src), str(flaxes[n])]))
            shutil.rmtree(work, ignore_errors=True)
            samples.setdefault(f"convert {n}l", []).append(run_tree(
                [sys.executable, "-m", "guard", "convert", str(src), "--to", "flax", "--out", str(work), "--parity"]))
            shutil.rmtree(work, ignore_errors=True)
            if n == theirs_layers:
                samples.setdefault(f"theirs {n}l", []).append(run_tree([theirs_python, "-c", THEIRS, str(src)]))
    rows = {key: median_run(runs) for key, runs in samples.items()}
    labels = {"parity": "ckpt-guard parity", "convert": "ckpt-guard convert --parity", "theirs": "transformers path"}
    for key, row in rows.items():
        kind, n = key.split()
        report(f"{labels[kind]} ({n[:-1]} layers, median of {rounds})", row)
    t = rows.get(f"theirs {theirs_layers}l")
    for label in ("parity", "convert"):
        ours = rows.get(f"{label} {theirs_layers}l")
        if t and ours:
            print(f"{label} {theirs_layers}l / transformers: memory {ours[1] / t[1]:.2f}x, time {ours[0] / t[0]:.2f}x")
        if f"{label} 12l" in rows and f"{label} 24l" in rows:
            print(f"{label} 24l / 12l peak: {rows[f'{label} 24l'][1] / rows[f'{label} 12l'][1]:.3f}x")
    print(f"load average after: {load_average()}", flush=True)


def deep(layers: list[int]) -> None:
    from convert import load_average, run_child

    print(f"load average before: {load_average()}", flush=True)
    peaks = {}
    for n in layers:
        src = OUT / f"narrow-{n}l"
        if not (src / "model.safetensors").is_file():
            subprocess.run([sys.executable, __file__, "--generate", "narrow", str(src), str(n)], check=True)
        flax = converted(src, OUT / f"narrow-{n}l-flax")
        size = (src / "model.safetensors").stat().st_size
        peaks[n] = run_child([sys.executable, "-m", "guard", "parity", str(src), str(flax)])
        report(f"ckpt-guard parity, narrow 70B-class, {n} layers ({size / 2**20:.0f} MiB bf16)", peaks[n])
    if len(peaks) > 1:
        low, high = min(peaks), max(peaks)
        print(f"peak {high}l / {low}l: {peaks[high][1] / peaks[low][1]:.3f}x")
    print(f"load average after: {load_average()}", flush=True)


def wide(width: str, layers: list[int], *, keep: bool) -> None:
    """Each size generated and converted (outside the measurement), measured, then deleted unless ``keep``:
    a full-width layer is 5.9 GB of bf16 on each side, and the disk is shared."""
    from convert import load_average, run_child

    print(f"load average before: {load_average()}", flush=True)
    peaks = {}
    for n in layers:
        src, flax = OUT / f"wide-{width}-{n}l", OUT / f"wide-{width}-{n}l-flax"
        if not (src / "model.safetensors").is_file():
            subprocess.run([sys.executable, __file__, "--generate", f"wide-{width}", str(src), str(n)], check=True)
        start = time.perf_counter()
        converted(src, flax)
        size = (src / "model.safetensors").stat().st_size
        written = sum(f.stat().st_size for f in flax.glob("flax_model*.msgpack"))  # one file or shards
        if abs(written - size) > size // 100:
            # a short file would send parity down the whole-model path, which would not fit: stop here
            raise SystemExit(f"{flax} holds {written} bytes against the source's {size}: convert it again")
        print(f"converted {n} layers at {width} width ({size / 2**30:.2f} GiB bf16) in "
              f"{time.perf_counter() - start:.0f} s; load average {load_average()}", flush=True)
        print(f"memory available before parity: {available_memory() / 2**30:.1f} GiB", flush=True)
        result = OUT / f"wide-{width}-{n}l.json"
        peaks[n] = run_child([sys.executable, "-m", "guard", "parity", str(src), str(flax), "-f", "json",
                              "-o", str(result)])
        report(f"ckpt-guard parity, {width} 70B width, {n} layer{'s' * (n > 1)} ({size / 2**30:.2f} GiB bf16)",
               peaks[n])
        parity = json.loads(result.read_text())["extra"]["parity"]  # a run that fell back to the whole model
        print(f"  passed {parity['passed']}, streamed {parity.get('streamed')}, blocks {parity.get('blocks')}, "
              f"vocabulary matrices streamed by {parity.get('leaves_streamed')}", flush=True)
        if not keep:
            shutil.rmtree(flax, ignore_errors=True)
            shutil.rmtree(src, ignore_errors=True)
    if len(peaks) > 1:
        low, high = min(peaks), max(peaks)
        print(f"peak {high}l / {low}l: {peaks[high][1] / peaks[low][1]:.3f}x")
    print(f"load average after: {load_average()}", flush=True)


ELEMENTS_AT_ONCE = 1 << 24  # drawn per slice: a 70B's vocabulary matrix never exists in fp32 here


def available_memory() -> int:
    """MemAvailable (bytes) where /proc/meminfo says it, else 0: what another run has left this one."""
    meminfo = Path("/proc/meminfo")
    lines = meminfo.read_text().splitlines() if meminfo.exists() else []
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")), 0)


def make_llama(directory: Path, shape: str, layers: int) -> None:
    """Random bf16 weights, tensor by tensor and slice by slice, as bench/convert.py writes its Llamas."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from guard.write.framing import safetensors_header

    config = LlamaConfig(**SHAPES[shape], num_hidden_layers=layers, architectures=["LlamaForCausalLM"])
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    directory.mkdir(parents=True, exist_ok=True)
    entries = [(name, "BF16", dims) for name, dims in shapes.items()]
    gen = torch.Generator().manual_seed(0)
    with open(directory / "model.safetensors", "wb") as fh:
        fh.write(safetensors_header(entries, {"format": "pt"}))
        for name, _code, dims in entries:
            row = math.prod(dims[1:])
            step = max(1, ELEMENTS_AT_ONCE // max(row, 1))
            for start in range(0, dims[0], step):
                part = (min(step, dims[0] - start), *dims[1:])
                t = torch.ones(part) if name.endswith("norm.weight") else torch.randn(part, generator=gen) * 0.02
                fh.write(t.to(torch.bfloat16).view(torch.uint8).numpy().tobytes())
    config.save_pretrained(directory)


def converted(src: Path, flax: Path) -> Path:
    """ckpt-guard's own conversion, once (untimed)."""
    from convert import run_child

    if not (flax / "flax_model.msgpack").is_file() and not (flax / "flax_model.msgpack.index.json").is_file():
        run_child([sys.executable, "-m", "guard", "convert", str(src), "--to", "flax", "--out", str(flax)])
    return flax


def report(label: str, row: tuple[float, int]) -> None:
    print(f"{label:<58} {row[0]:7.1f} s  peak RSS {row[1] / 2**30:5.2f} GiB", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--wall", action="store_true")
    parser.add_argument("-k", dest="names", action="append", default=[])
    parser.add_argument("--bases", action="store_true", help="each model_type's base class (and those of -k)")
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    parser.add_argument("--layers", default=None, help="--wall: one count; --memory/--deep/--wide: a comma list")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--rounds", type=int, default=2, help="--memory: runs of each, alternating (median)")
    parser.add_argument("--deep", action="store_true")
    parser.add_argument("--wide", action="store_true")
    parser.add_argument("--width", choices=sorted(WIDE), default="half", help="--wide: a 70B's width or half")
    parser.add_argument("--keep", action="store_true", help="--wide: keep the generated models")
    parser.add_argument("--generate", nargs=3, metavar=("SHAPE", "DIR", "LAYERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        make_llama(Path(args.generate[1]), args.generate[0], int(args.generate[2]))
        return 0
    counts = [int(n) for n in args.layers.split(",")] if args.layers else None
    if args.memory:
        memory(counts or [12, 24], args.rounds)
    if args.deep:
        deep(counts or [12, 24, 48])
    if args.wide:
        wide(args.width, counts or [1, 2], keep=args.keep)
    if args.sweep:
        sweep(args.names, args.dtype, bases=args.bases)
    if args.sweep or args.summary:
        print(summary(args.dtype))
    if args.wall:
        wall(counts[0] if counts else 12)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
