"""The scan's cost with the loading rules on, this tree against an earlier commit's, in the same run.

Whole ``python -m guard scan`` processes, the two trees alternating (``PYTHONPATH`` the tree's, the earlier one
taken out of git with ``git archive``), medians of CPU (the steadier figure on a shared machine) and wall time:

  * ``20-shard``: a Llama whose config.json names ``LlamaForCausalLM`` (the rules run), 20 layers in 20 shards
    with its index, every name and shape the class builds (hidden 256);
  * ``200k``: ``bench/scan.py``'s 4,000 shards x 50 tensors (200,000; config.json names no class);
  * ``tree``: ``bench/scan.py``'s 20-component diffusers-style tree;
  * ``loading``: ``bench/scan.py --cases loading``'s per-expert Qwen3-MoE (197,763 tensors, its class named), whole
    and with experts 2-3 of layer 0 left out.

    .venv/bin/python bench/loading_cost.py [--against 56c2edc] [--rounds 9] [--cases 20-shard 200k tree loading]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import scan as scan_bench  # noqa: E402  bench/scan.py's generators and timer

CASES = ("20-shard", "200k", "tree", "loading")


def generate_llama(out: Path, layers: int = 20, hidden: int = 256) -> Path:
    """A Llama as save_pretrained shards it (one layer a shard; compact headers, zeros), config naming its class."""
    root = out / f"llama-{layers}-shards"
    if (root / ".built").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    inter, vocab, heads, kv = hidden * 3, 512, 8, 4
    head_dim = hidden // heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
              "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 256,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "5.25.0"}
    shapes = {"input_layernorm.weight": [hidden], "post_attention_layernorm.weight": [hidden],
              "mlp.down_proj.weight": [hidden, inter], "mlp.gate_proj.weight": [inter, hidden],
              "mlp.up_proj.weight": [inter, hidden], "self_attn.k_proj.weight": [kv * head_dim, hidden],
              "self_attn.o_proj.weight": [hidden, hidden], "self_attn.q_proj.weight": [hidden, hidden],
              "self_attn.v_proj.weight": [kv * head_dim, hidden]}
    shards: list[list[tuple[str, list[int]]]] = []
    for shard in range(layers):  # one layer a shard, the embedding in the first, the norm and the head in the last
        tensors = {f"model.layers.{shard}.{k}": v for k, v in shapes.items()}
        if shard == 0:
            tensors["model.embed_tokens.weight"] = [vocab, hidden]
        if shard == layers - 1:
            tensors.update({"model.norm.weight": [hidden], "lm_head.weight": [vocab, hidden]})
        shards.append(list(tensors.items()))
    return scan_bench.write_bf16_shards(root, shards, config)


def inputs(out: Path, cases: list[str]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    if "20-shard" in cases:
        found["20-shard"] = generate_llama(out)
    if "200k" in cases:
        found["200k"] = scan_bench.generate_sharded(out, 4000, 50)
    if "tree" in cases:
        found["tree"] = scan_bench.generate_pipeline(out)[0]
    if "loading" in cases:
        for kind in ("whole", "missing"):
            found[f"loading {kind}"] = scan_bench.generate_moe(out, missing=kind == "missing")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--against", default="56c2edc", help="the earlier commit (git archive of its guard/)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--out", type=Path, default=scan_bench.OUT / "loading_cost")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the tree measured (default: this checkout)")
    args = parser.parse_args(argv)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    args.out.mkdir(parents=True, exist_ok=True)
    roots = inputs(args.out.resolve(), args.cases)
    py = sys.executable
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="cg-against-") as scratch:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against, "guard"], capture_output=True,
                                 check=True)
        subprocess.run(["tar", "-x", "-C", scratch], input=archive.stdout, check=True)
        trees = {args.against: scratch, "this tree": str(args.tree)}
        for case, root in roots.items():
            cmds = {name: ["env", f"PYTHONPATH={tree}", py, "-m", "guard", "scan", "--no-summary", str(root)]
                    for name, tree in trees.items()}
            runs = scan_bench.alternated_runs(cmds, args.rounds)
            wall, cpu, _ = scan_bench.medians(runs)  # (peak RSS: a forked child's counts this parent's pages)
            old, new = args.against, "this tree"
            paired = statistics.median(b[2] / a[2] for a, b in zip(runs[old], runs[new]))
            print(f"{case:<16} {old}: cpu {cpu[old] * 1000:6.0f} ms wall {wall[old] * 1000:6.0f} ms | this tree: "
                  f"cpu {cpu[new] * 1000:6.0f} ms wall {wall[new] * 1000:6.0f} ms | cpu {cpu[new] / cpu[old]:.3f}x, "
                  f"paired by round {paired:.3f}x", flush=True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
