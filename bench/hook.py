"""Benchmark: the pre-commit hook's whole-process time vs `check-added-large-files`.

Builds a repository with a 20-shard model totalling ~2 GB (real bytes, a
Llama-like header per shard, plus the shard index and config.json), then runs
in alternating order, as pre-commit would call each hook with the file list:
  * `ckpt-guard scan --format text --no-summary FILES...`   (the hook's entry)
  * `check-added-large-files --enforce-all --maxkb=N FILES...` (pre-commit-hooks)
Target: the same order of magnitude.  Needs `pip install pre-commit-hooks`.

Usage: .venv/bin/python bench/hook.py [--size-gb 2] [--shards 20] [--rounds 10] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOCS = ROOT / "docs" / "benchmarks.md"
HEADING = "## Pre-commit hook"
CHUNK = b"\0" * (16 << 20)


def write_shard(path: Path, first_layer: int, size: int, hidden: int = 1024) -> dict[str, str]:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset, layer, names = 0, first_layer, {}
    while offset < size:
        for part, rows in (("self_attn.q_proj", hidden), ("self_attn.k_proj", hidden // 4),
                           ("self_attn.v_proj", hidden // 4), ("self_attn.o_proj", hidden),
                           ("mlp.gate_proj", 2816), ("mlp.up_proj", 2816), ("input_layernorm", 0)):
            shape = [rows, hidden] if rows else [hidden]
            nbytes = 4 * (rows or 1) * hidden
            name = f"model.layers.{layer}.{part}.weight"
            header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + nbytes]}
            names[name] = path.name
            offset += nbytes
            if offset >= size:
                break
        layer += 1
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        left = offset
        while left > 0:
            left -= fh.write(CHUNK[: min(left, len(CHUNK))])
    return names


def generate(repo: Path, size_gb: float, shards: int) -> list[Path]:
    model = repo / "model"
    stamp = model / f".built-{size_gb}-{shards}"
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    files = [model / n for n in names] + [model / "model.safetensors.index.json", model / "config.json"]
    if stamp.exists():
        return files
    shutil.rmtree(repo, ignore_errors=True)
    model.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    weight_map: dict[str, str] = {}
    for i, name in enumerate(names):
        weight_map |= write_shard(model / name, first_layer=i * 1000, size=int(size_gb * 1e9 / shards))
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float32"}))
    stamp.touch()
    return files


def timed(cmd: list[str], cwd: Path) -> tuple[float, int]:
    start = time.perf_counter()
    rc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    return time.perf_counter() - start, rc


def write_docs(section: str) -> None:
    text = DOCS.read_text(encoding="utf-8") if DOCS.exists() else "# Benchmarks\n"
    start = text.find(HEADING + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:  # replace our section only: up to the next second-level heading
        end = text.find("\n## ", start + len(HEADING))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    DOCS.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "hook")
    parser.add_argument("--write-docs", action="store_true", help=f"update '{HEADING}' in docs/benchmarks.md")
    args = parser.parse_args()
    large = BIN / "check-added-large-files"
    if not large.exists():
        print("check-added-large-files is missing: .venv/bin/pip install pre-commit-hooks", file=sys.stderr)
        return 2
    files = generate(args.out, args.size_gb, args.shards)
    rel = [str(f.relative_to(args.out)) for f in files]
    total = sum(f.stat().st_size for f in files)
    commands = {
        "ckpt-guard": [str(BIN / "ckpt-guard"), "scan", "--format", "text", "--no-summary", *rel],
        "check-added-large-files": [str(large), "--enforce-all", f"--maxkb={10**7}", *rel],
        "python -c pass": [sys.executable, "-c", "pass"],  # interpreter start-up, for scale
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for name, cmd in commands.items():  # warm the page cache and check both hooks pass
        _, rc = timed(cmd, args.out)
        assert rc == 0, f"{name} exited {rc}"
    for round_ in range(args.rounds):
        order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
        for name in order:
            times[name].append(timed(commands[name], args.out)[0])
    median = {name: statistics.median(values) for name, values in times.items()}
    ours, theirs = median["ckpt-guard"], median["check-added-large-files"]
    rows = "\n".join(f"| {name} | {median[name] * 1000:.0f} ms | {min(times[name]) * 1000:.0f} ms |"
                     for name in commands)
    section = f"""{HEADING}

`bench/hook.py`: whole-process time of the hook as pre-commit calls it, on {len(files)} files
({args.shards} safetensors shards, their index and config.json; {total / 1e9:.2f} GB on disk), median of
{args.rounds} alternating rounds after a warm-up. Both hooks pass on these files.

| command | median | best |
|---|---:|---:|
{rows}

ckpt-guard / check-added-large-files: **{ours / theirs:.2f}x** (target: same order of magnitude).
Machine: {platform.machine()}, Python {platform.python_version()}, {platform.system()}.
ckpt-guard reads headers only, so the time does not grow with the bytes of the shards.
"""
    print(section)
    if args.write_docs:
        write_docs(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
