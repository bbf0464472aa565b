"""Benchmark: scanning a quantized set costs the same per tensor as an unquantized one.

Writes two safetensors sets of the same tensor count with tiny tensors (headers dominate): a
GPTQ-style set (qweight, qzeros, scales, g_idx per Linear, a quantization_config) and a plain fp16
set, then times `ckpt-guard scan --expect config DIR` (whole processes started as the command starts,
`python -m guard`, alternating, median of --rounds) at two sizes, so the cost per tensor is compared
across sizes as well as across kinds (target: the quantized per-tensor time within 1.2x of the plain
one, flat in size).  CPU is the children's user + system time: on a shared machine the steadier figure.

``--trees A B``: the same sets scanned by other checkouts too (each on its own PYTHONPATH), in the same
rounds, so code before and after a change is compared under the same load.

Usage: .venv/bin/python bench/quantized_scan.py [--modules 5000 20000] [--rounds 5] [--trees DIR ...]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_set(folder: Path, modules: int, *, quantized: bool) -> int:
    """One safetensors file of ``modules`` Linear modules (4 tensors each), written header-first by hand
    (safetensors' own writer would hold every tensor in memory): every tensor 1 element wide."""
    folder.mkdir(parents=True)
    parts = ((".qweight", "I32"), (".qzeros", "I32"), (".scales", "F16"), (".g_idx", "I32")) if quantized else \
        ((".weight", "F16"), (".bias", "F16"), ("_norm.weight", "F16"), ("_norm.bias", "F16"))
    header: dict[str, object] = {}
    offset = 0
    for index in range(modules):
        for suffix, dtype in parts:
            size = 4 if dtype == "I32" else 2
            header[f"model.layers.{index // 7}.m{index % 7}{suffix}"] = {
                "dtype": dtype, "shape": [1, 1] if suffix != ".g_idx" else [1], "data_offsets": [offset, offset + size]}
            offset += size
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    config = {"model_type": "llama", "torch_dtype": "float16"}
    if quantized:
        config["quantization_config"] = {"quant_method": "gptq", "bits": 32, "group_size": 1, "desc_act": False}
    (folder / "config.json").write_text(json.dumps(config))
    return len(header)


def run(tree: Path, folder: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one scan, as `ckpt-guard` runs it (``main()`` with no arguments: the process's
    own collector settings and exit)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "guard", "scan", "--expect", "config", str(folder)], cwd=tree,
                             env=env, stdout=subprocess.DEVNULL)
    _, _, usage = os.wait4(child.pid, 0)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modules", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trees", type=Path, nargs="+", default=[ROOT])
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    for tree in trees:  # every module from its bytecode, as an installed package (PYTHONDONTWRITEBYTECODE or not)
        compileall.compile_dir(tree / "guard", quiet=1)
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as scratch:
        for modules in args.modules:
            plain, packed = Path(scratch) / f"plain{modules}", Path(scratch) / f"gptq{modules}"
            tensors = write_set(plain, modules, quantized=False)
            write_set(packed, modules, quantized=True)
            times: dict[tuple[Path, str], list[tuple[float, float]]] = {
                (tree, kind): [] for tree in trees for kind in ("plain", "gptq")}
            for _ in range(args.rounds):
                for tree in trees:
                    times[(tree, "plain")].append(run(tree, plain))
                    times[(tree, "gptq")].append(run(tree, packed))
            for tree in trees:
                wall = {kind: statistics.median(t[0] for t in times[(tree, kind)]) for kind in ("plain", "gptq")}
                cpu = {kind: statistics.median(t[1] for t in times[(tree, kind)]) for kind in ("plain", "gptq")}
                print(f"{tree}: {tensors:,} tensors: "
                      f"plain {wall['plain']:.3f} s wall, {cpu['plain']:.3f} s CPU "
                      f"({cpu['plain'] / tensors * 1e6:.1f} µs/tensor); "
                      f"gptq {wall['gptq']:.3f} s wall, {cpu['gptq']:.3f} s CPU "
                      f"({cpu['gptq'] / tensors * 1e6:.1f} µs/tensor); "
                      f"ratio {wall['gptq'] / wall['plain']:.2f} wall, {cpu['gptq'] / cpu['plain']:.2f} CPU")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
