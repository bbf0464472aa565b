"""Benchmark: `ckpt-guard hub diff` of two revisions of a sharded model, against the loopback stand-in Hub.

Revision 1: N safetensors shards (written by safetensors) with an index and config.json; revision 2:
the same model re-saved with one layer per shard recast to bf16 and the embedding resized.  Counted by
the stand-in: the requests and the weight bytes `hub diff` reads, against the weight bytes of both
revisions; timed with a per-request latency (default 50 ms, a round trip to the Hub).
Target: under 1 % of the weight bytes.

    python bench/hub_diff.py [--shards 20] [--shard-mb 16] [--latency 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hub_standin import StandinHub  # noqa: E402

MB = 1024 * 1024


def revision(shards: int, shard_mb: int, *, changed: bool) -> dict[str, bytes]:
    import numpy as np
    from safetensors.numpy import save

    files, weight_map = {}, {}
    rows = shard_mb * MB // (4 * 1024)
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layers.{i}.mlp.weight": np.zeros((rows - 8, 1024), np.float32),
                   f"layers.{i}.norm.weight": np.zeros((1024,), np.float32)}
        if changed:
            tensors[f"layers.{i}.norm.weight"] = np.zeros((1024,), np.float16)
        if i == 0:
            tensors["embed.weight"] = np.zeros((8 + changed * 8, 1024), np.float32)
        files[name] = save(tensors)
        weight_map.update({t: name for t in tensors})
    files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    files["config.json"] = b'{"model_type": "llama", "torch_dtype": "float32"}'
    return files


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--shard-mb", type=int, default=16)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp())
    hub = StandinHub(latency=args.latency).start()
    os.environ.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1")
    one = revision(args.shards, args.shard_mb, changed=False)
    two = revision(args.shards, args.shard_mb, changed=True)
    old = hub.add_repo("org/big", one)
    new = hub.add_commit("org/big", two)
    weights = sum(len(d) for f in (one, two) for n, d in f.items() if n.endswith(".safetensors"))
    from guard.cli import main as cli

    hub.reset_records()
    start = time.perf_counter()
    code = cli(["hub", "diff", "org/big", "--from", old, "--to", new, "--format", "json", "--output",
                str(home / "diff.json")])
    seconds = time.perf_counter() - start
    read = sum(r.bytes for r in hub.records if r.method == "GET" and r.path.endswith(".safetensors"))
    print(f"hub diff, {args.shards} shards x {args.shard_mb} MiB, two revisions ({weights / MB:,.0f} MiB of "
          f"weights), {args.latency * 1000:.0f} ms per request: exit {code}, {len(hub.records)} requests, "
          f"{read / 1024:,.0f} KiB of weights read ({100 * read / weights:.2f} %), {seconds:.2f} s")
    hub.stop()


if __name__ == "__main__":
    main()
