"""Benchmark: `ckpt-guard scan --values` vs `cat` of the same files to /dev/null (warm cache).

Two bf16 Llama-style models (transformers LlamaConfig, random weights, the converter
benchmark's generator): the ~1.5 GB one of bench/convert.py and a 4-layer one of about
0.65 GB.  Whole processes, alternating; wall time and peak RSS from os.wait4.
Target: at most 3x cat's wall time on the ~1.5 GB model (warm cache); peak memory independent of
model size.  CPU time (user + system, from the same rusage) is printed beside wall time: on this
shared machine a loaded CPU stretches wall time, CPU time much less.

    python bench/values.py [--rounds 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import convert as convert_bench  # noqa: E402  (its make_model and CONFIG)

MODELS = {
    "llama-bf16": (ROOT / "bench" / "out" / "convert" / "llama-bf16", {}),
    "llama-bf16-4l": (ROOT / "bench" / "out" / "values" / "llama-bf16-4l", {"num_hidden_layers": 4}),
}


def ensure_model(directory: Path, overrides: dict[str, int]) -> int:
    """Generated in a child process: a forked child's peak RSS starts at its parent's."""
    if not (directory / "model.safetensors").is_file():
        print(f"generating {directory} ...", flush=True)
        subprocess.run([sys.executable, __file__, "--generate", str(directory), json.dumps(overrides)],
                       check=True)
    return (directory / "model.safetensors").stat().st_size


def generate(directory: Path, overrides: dict[str, int]) -> None:
    convert_bench.CONFIG.update(overrides)
    convert_bench.make_model(directory)


def run_child(argv: list[str], *, stdout: int | None = subprocess.DEVNULL) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds of one child; exit 1 (findings) is fine, 2 is not."""
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{argv[:6]} failed")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--generate", nargs=2, metavar=("DIR", "OVERRIDES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    # An installed package runs from compiled bytecode; with PYTHONDONTWRITEBYTECODE set, every child
    # would compile each guard module from source again (a third of a tiny scan's start-up here).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.generate:
        generate(Path(args.generate[0]), json.loads(args.generate[1]))
        return 0
    rows = []
    load_before = os.getloadavg()
    for label, (directory, overrides) in MODELS.items():
        size = ensure_model(directory, overrides)
        files = [str(p) for p in sorted(directory.glob("*.safetensors"))]
        commands = {
            "cat": ["cat", *files],
            "scan --values": [sys.executable, "-m", "guard", "scan", "--values", "--expect", "bf16",
                              "--no-summary", str(directory)],
            "scan --values --target torch:fp16": [sys.executable, "-m", "guard", "scan", "--values",
                                                  "--expect", "bf16", "--target", "torch:fp16",
                                                  "--no-summary", str(directory)],
        }
        run_child(commands["cat"])  # warm the page cache
        runs: dict[str, list[tuple[float, int, float]]] = {name: [] for name in commands}
        for i in range(args.rounds):
            for name in (list(commands) if i % 2 == 0 else list(reversed(commands))):
                runs[name].append(run_child(commands[name]))
                wall, rss, cpu = runs[name][-1]
                print(f"{label} round {i + 1} {name:<36} {wall:6.2f} s  cpu {cpu:6.2f} s  "
                      f"peak RSS {rss / 1e6:7.1f} MB", flush=True)
        medians = {name: (statistics.median(r[0] for r in rr), int(statistics.median(r[1] for r in rr)),
                          statistics.median(r[2] for r in rr)) for name, rr in runs.items()}
        rows.append({"model": label, "bytes": size,
                     **{name: {"wall_s": m[0], "peak_rss": m[1], "cpu_s": m[2]} for name, m in medians.items()},
                     "ratio": medians["scan --values"][0] / medians["cat"][0],
                     "cpu_ratio": medians["scan --values"][2] / medians["cat"][2],
                     "ratio_fp16_target": medians["scan --values --target torch:fp16"][0] / medians["cat"][0]})
    figures = {"rounds": args.rounds, "cpus": os.cpu_count(), "models": rows,
               "load": [list(load_before), list(os.getloadavg())]}
    print(json.dumps(figures, indent=2))
    if args.write_docs:
        write_docs(figures)
    return 0


def write_docs(f: dict) -> None:  # type: ignore[type-arg]
    lines = [
        "## Value scans", "",
        f"`python bench/values.py --write-docs`: `ckpt-guard scan --values` against `cat FILES > /dev/null` on "
        f"random bf16 Llama-style models (bench/convert.py's generator), page cache warm, whole processes, "
        f"alternating, median of {f['rounds']} rounds, {f['cpus']} CPUs, load average "
        f"{f['load'][0][0]:.1f} at the start and {f['load'][1][0]:.1f} at the end (other engineers' test runs). "
        "Target: at most 3x `cat` on the 1.48 GB model; peak memory independent of model size. CPU is user + "
        "system time of the same processes.", "",
        "| model | size | `cat` | `scan --values` | ratio | cpu `cat` | cpu `scan --values` | cpu ratio "
        "| with `--target torch:fp16` | ratio | peak RSS `scan --values` | peak RSS `cat` |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in f["models"]:
        scan, fp16, cat = r["scan --values"], r["scan --values --target torch:fp16"], r["cat"]
        lines.append(
            f"| {r['model']} | {r['bytes'] / 1e9:.2f} GB | {cat['wall_s']:.2f} s | {scan['wall_s']:.2f} s "
            f"| {r['ratio']:.1f}x | {cat['cpu_s']:.2f} s | {scan['cpu_s']:.2f} s | {r['cpu_ratio']:.1f}x "
            f"| {fp16['wall_s']:.2f} s | {r['ratio_fp16_target']:.1f}x "
            f"| {scan['peak_rss'] / 1e6:.0f} MB | {cat['peak_rss'] / 1e6:.1f} MB |")
    lines += ["", "Tensor data is read with `preadv` into one reused 256 KiB buffer per worker thread (tensors "
              "are scanned on up to 4 threads; numpy and `preadv` release the GIL) and examined on its raw bits, "
              "so peak RSS is the interpreter, numpy and a few chunk-sized work arrays, whatever the model "
              "size. The fp16 range figures are computed on every scan; `--target torch:fp16` adds the CG201/"
              "CG202 findings, not work.", "",
              "Issue 23, first round: the chunk went from 1 MiB to 256 KiB (a chunk and its work arrays stay "
              "in a core's L2 cache across the passes over them; 128 KiB and 512 KiB measured slower again in "
              "the second round), and this benchmark runs the package from compiled bytecode, as an installed "
              "one runs (with PYTHONDONTWRITEBYTECODE set every child compiled each guard module again).", "",
              "Second round (the CPU ratio was 3.1x here, 2.7-3.0x on a quieter machine): a chunk now costs three "
              "passes (magnitudes, their maximum, the flags of the tiny values) and one gather, where it cost "
              "those and about a dozen numpy calls on the few hundred values under 2^-14. The tiny values are "
              "found four flags at a time (one uint32) and gathered as whole groups: boolean indexing walked "
              "every flag twice, one at a time. From bf16 only values under 2^-17 are gathered, the only ones an "
              "fp16 cast can lose, and their fate (flushed, rounded, exact) is looked up per bit pattern in a "
              "64 Ki-entry table instead of cast. They wait in a batch of up to 64 Ki values, and once a tensor "
              "has shown a non-zero one no chunk computes its own minimum. numpy is imported with "
              "`OPENBLAS_NUM_THREADS=1` unless the user set it: starting OpenBLAS's threads was ~0.04 s of the "
              "import's CPU time on two cores, and a value scan multiplies no matrices. Every figure and finding "
              "is the same: the old and the new kernel were compared on random tensors of every source dtype "
              "(zeros, NaN/Inf, subnormals, odd chunk lengths, every cast target) and on these models' JSON "
              "reports, byte for byte. Measured beside the tree before it (a `git archive` of it on "
              "`PYTHONPATH`, same minutes, 5 and 3 rounds): "
              "CPU time 0.76-0.78 s before and 0.60 s after on the 1.48 GB model against `cat`'s 0.28 s (2.7-2.8x "
              "to 2.1x), 0.39-0.40 s before and 0.30 s after on the 0.67 GB one (3.8x to 2.7x).", "",
              "Where the CPU time of the 1.48 GB scan goes now: ~0.09 s start-up (interpreter, guard, numpy "
              "and ml_dtypes), ~0.25 s copying the bytes out of the page cache (what `cat` spends: the floor of "
              "reading with `preadv`; mapping the file would skip the copy, at the price of a SIGBUS if a file "
              "shrinks while it is scanned), ~0.18 s of numpy passes and gathers, ~0.05 s the rest (reads, "
              "progress, report). Two worker threads on two CPUs give a lower wall time than one and 0.02-0.1 s "
              "more CPU time (GIL handoffs between numpy calls); a loaded machine stretches the wall-time ratio "
              "toward the CPU ratio or beyond, as a process of two threads and `cat` get different shares.", ""]
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n\n"
    section = "\n".join(lines)
    pattern = re.compile(r"^## Value scans\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _m: section + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
