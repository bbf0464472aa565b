"""Benchmark: scanning a quantized set costs the same per tensor as an unquantized one.

Writes two safetensors sets of the same tensor count with tiny tensors (headers dominate): a
GPTQ-style set (qweight, qzeros, scales, g_idx per Linear, a quantization_config) and a plain fp16
set, then times `ckpt-guard scan --expect config DIR` (whole processes, alternating, median of
--rounds) at two sizes, so the cost per tensor is compared across sizes as well as across kinds
(target: the quantized per-tensor time within 1.2x of the plain one, flat in size).

Usage: .venv/bin/python bench/quantized_scan.py [--modules 5000 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
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


def run(folder: Path) -> float:
    start = time.perf_counter()
    code = f"from guard.cli import main; raise SystemExit(main(['scan', '--expect', 'config', {str(folder)!r}]))"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modules", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        for modules in args.modules:
            plain, packed = Path(scratch) / f"plain{modules}", Path(scratch) / f"gptq{modules}"
            tensors = write_set(plain, modules, quantized=False)
            write_set(packed, modules, quantized=True)
            times: dict[str, list[float]] = {"plain": [], "gptq": []}
            for _ in range(args.rounds):
                times["plain"].append(run(plain))
                times["gptq"].append(run(packed))
            median = {kind: statistics.median(values) for kind, values in times.items()}
            print(f"{tensors:,} tensors: plain {median['plain']:.3f} s ({median['plain'] / tensors * 1e6:.1f} µs/tensor), "
                  f"gptq {median['gptq']:.3f} s ({median['gptq'] / tensors * 1e6:.1f} µs/tensor), "
                  f"ratio {median['gptq'] / median['plain']:.2f}")


if __name__ == "__main__":
    main()
