"""Benchmark: header-only scan vs the reference loaders, whole processes, alternating.

Generates a ~1 GiB torch zip `.bin` and the same weights as safetensors, then
times, in alternating order:
  * `ckpt-guard scan FILE`                                (ours)
  * `python -c "torch.load(p, mmap=True, weights_only=True)"`   (target: ours >= 5x faster)
  * listing dtypes with `safetensors.safe_open`           (target: ours at most 1.15x its time)
and reports the bytes our readers read as a share of each file (target < 1%).

It also scans a 20-component diffusers-style tree (every component with its fp16 variant, a
model_index.json at the root) and compares the time per file with the previous release's scan
(v0.1.0, commit BASELINE_REV, checked out of git into a scratch folder) in the same run: grouping
files into weight sets must not make a scan slower per file.

Usage: .venv/bin/python bench/scan.py [--size-gib 1.0] [--rounds 7] [--out bench/out/scan]
"""

from __future__ import annotations

import argparse
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
OUT = ROOT / "bench" / "out"
BASELINE_REV = "d732c00"  # v0.1.0 as it landed: one model per directory, no weight sets


def generate(out: Path, size_gib: float) -> tuple[Path, Path]:
    import torch
    from safetensors.torch import save_file

    # one model directory each: a file argument stands for its directory, which would scan both
    bin_path, st_path = out / "bin" / "pytorch_model.bin", out / "safetensors" / "model.safetensors"
    if bin_path.exists() and st_path.exists():
        return bin_path, st_path
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    st_path.parent.mkdir(parents=True, exist_ok=True)
    hidden, layers = 2048, 0
    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.zeros(32000, hidden)}
    budget = size_gib * 2**30 - tensors["model.embed_tokens.weight"].nbytes
    while budget > 0:  # Llama-style blocks until the size is reached
        p = f"model.layers.{layers}."
        block = {
            p + "self_attn.q_proj.weight": torch.zeros(hidden, hidden),
            p + "self_attn.k_proj.weight": torch.zeros(hidden // 4, hidden),
            p + "self_attn.v_proj.weight": torch.zeros(hidden // 4, hidden),
            p + "self_attn.o_proj.weight": torch.zeros(hidden, hidden),
            p + "mlp.gate_proj.weight": torch.zeros(5632, hidden),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        }
        tensors.update(block)
        budget -= sum(t.nbytes for t in block.values())
        layers += 1
    torch.save(tensors, bin_path)
    save_file(tensors, st_path)
    return bin_path, st_path


def timed(cmd: list[str], *, env: dict[str, str] | None = None, check: bool = True) -> float:
    """Wall seconds of one whole process, run in bench/out (no pyproject.toml there for a scan to read)."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=OUT)
    if check and proc.returncode not in (0, 1):  # 1: findings; anything else is a broken run
        raise SystemExit(f"{cmd[:4]} exited {proc.returncode}")
    return time.perf_counter() - start


def _header_only_safetensors(path: Path, dtype: str, tensors: int) -> None:
    size = {"F32": 4, "F16": 2}[dtype]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for i in range(tensors):
        n = 4096
        header[f"down_blocks.{i // 8}.resnets.{i % 8}.conv.weight"] = {
            "dtype": dtype, "shape": [n], "data_offsets": [offset, offset + n * size]}
        offset += n * size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def generate_pipeline(out: Path, components: int = 20) -> tuple[Path, int]:
    """A diffusers-style tree: each component with its default and fp16 safetensors and config.json."""
    root = out / "pipeline"
    names = [f"component_{i:02d}" for i in range(components)]
    if not root.is_dir():
        root.mkdir(parents=True)
        (root / "model_index.json").write_text(json.dumps(
            {"_class_name": "StableDiffusionPipeline", **{n: ["diffusers", "UNet2DModel"] for n in names}}))
        for name in names:
            folder = root / name
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
            _header_only_safetensors(folder / "diffusion_pytorch_model.safetensors", "F32", 120)
            _header_only_safetensors(folder / "diffusion_pytorch_model.fp16.safetensors", "F16", 120)
    return root, 2 * components


def baseline_checkout(scratch: Path) -> Path | None:
    """The previous release's package, from git, or None where this is not a git checkout."""
    target = scratch / "baseline"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE_REV, "guard"], capture_output=True)
    if archive.returncode:
        return None
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def bytes_share(path: Path) -> tuple[int, int]:
    sys.path.insert(0, str(ROOT))
    from guard.readers import scan_file
    from guard.sources import LocalFile

    with LocalFile(path) as src:
        scan = scan_file(src)
        assert not scan.findings or all(f.code != "CG001" for f in scan.findings), scan.findings
        return src.bytes_read, src.size


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "scan")
    args = parser.parse_args()
    bin_path, st_path = generate(args.out, args.size_gib)
    py = sys.executable
    cases = {
        "ckpt-guard scan .bin": [py, "-m", "guard", "scan", "--no-summary", str(bin_path)],
        "ckpt-guard scan .safetensors": [py, "-m", "guard", "scan", "--no-summary", str(st_path)],
        "torch.load(mmap=True, weights_only=True) .bin": [
            py, "-c", f"import torch; torch.load({str(bin_path)!r}, mmap=True, weights_only=True)"],
        "safe_open dtype listing .safetensors": [
            py, "-c",
            "from safetensors import safe_open\n"
            f"with safe_open({str(st_path)!r}, framework='numpy') as f:\n"
            "    [f.get_slice(k).get_dtype() for k in f.keys()]"],
    }
    for cmd in cases.values():  # warm the page cache and the interpreters
        timed(cmd)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, cmd in cases.items():  # alternate, so drift hits every case alike
            samples[name].append(timed(cmd))
    med = {name: statistics.median(v) for name, v in samples.items()}
    print(f"files: {bin_path.stat().st_size / 2**30:.2f} GiB .bin, {st_path.stat().st_size / 2**30:.2f} GiB "
          f".safetensors; {args.rounds} alternating rounds, median wall time per whole process")
    for name, value in med.items():
        print(f"  {name:<48} {value * 1000:8.1f} ms")
    ratio_torch = med["torch.load(mmap=True, weights_only=True) .bin"] / med["ckpt-guard scan .bin"]
    ratio_st = med["ckpt-guard scan .safetensors"] / med["safe_open dtype listing .safetensors"]
    print(f"torch.load / ckpt-guard (.bin):          {ratio_torch:5.1f}x faster  (target >= 5x)")
    print(f"ckpt-guard / safe_open (.safetensors):   {ratio_st:5.2f}x         (target <= 1.15x)")
    for path in (bin_path, st_path):
        read, size = bytes_share(path)
        print(f"bytes read, {path.name:<22} {read:>10,} of {size:>14,} = {read / size:.5%}  (target < 1%)")
    import_profile(st_path)
    layout_per_file(args.out, args.rounds)
    return 0


def import_profile(path: Path, top: int = 5) -> None:
    """`python -X importtime` of a scan: the total, and the modules that cost the most themselves."""
    import re

    runs = []
    for _ in range(5):
        err = subprocess.run([sys.executable, "-X", "importtime", "-m", "guard", "scan", "--no-summary", str(path)],
                             capture_output=True, text=True, cwd=OUT).stderr
        rows = [m.groups() for m in re.finditer(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)", err)]
        runs.append({name: (int(own), int(cumulative), len(indent)) for own, cumulative, indent, name in rows})
    best = {name: min(r[name][0] for r in runs if name in r) for name in runs[0]}
    total = min(sum(v[1] for v in r.values() if v[2] == 0) for r in runs)
    print(f"imports of `ckpt-guard scan {path.name}` (python -X importtime, best of 5): {total / 1000:.1f} ms;"
          f" top {top} by own time:")
    for name, own in sorted(best.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {name:<40} {own / 1000:6.2f} ms")


def layout_per_file(out: Path, rounds: int) -> None:
    tree, files = generate_pipeline(out)
    py = sys.executable
    cmd = [py, "-m", "guard", "scan", "--no-summary", str(tree)]
    with tempfile.TemporaryDirectory(prefix="cg-baseline-") as scratch:
        baseline = baseline_checkout(Path(scratch))
        if baseline is None:
            print(f"layout: no git history here, so no {BASELINE_REV} baseline to compare with")
            return
        old_env = {**os.environ, "PYTHONPATH": str(baseline)}
        new_env = {**os.environ, "PYTHONPATH": str(ROOT)}
        timed(cmd, env=old_env), timed(cmd, env=new_env)
        old, new = [], []
        for _ in range(rounds):
            old.append(timed(cmd, env=old_env))
            new.append(timed(cmd, env=new_env))
    per_old, per_new = statistics.median(old) / files * 1000, statistics.median(new) / files * 1000
    print(f"layout: 20-component diffusers-style tree, {files} weight files with fp16 variants, {rounds} rounds")
    print(f"  v0.1.0 ({BASELINE_REV}) scan: {statistics.median(old) * 1000:8.1f} ms = {per_old:.2f} ms per file")
    print(f"  weight-set scan:       {statistics.median(new) * 1000:8.1f} ms = {per_new:.2f} ms per file")
    print(f"  per file, weight sets / v0.1.0: {per_new / per_old:5.2f}x  (target <= 1.0x)")


if __name__ == "__main__":
    raise SystemExit(main())
