"""The JAX side of parity where JAX users run it: on whatever backend JAX picks (a TPU, a GPU, the CPU).

Measures, for docs/parity.md:
- a plain fp32 matmul and an 8-layer RMSNorm + MLP chain at JAX's default matmul precision and at
  "high" and "highest", each against a float64 NumPy reference computed on the host;
- `ckpt-guard parity --drift` on Llamas saved by transformers in fp32 (2 and 8 layers) and converted
  by `ckpt-guard convert --to flax`: the verdict (fp32 passes run at "highest") and the drift the same
  pass shows at the default precision, against PyTorch fp32 on the host's CPU.

    python bench/parity_accelerator.py [--layers 2,8] [--json OUT.json]

Nothing here is a test: CI has no accelerator.  On a CPU the default precision is full fp32, so every
drift reads 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def matmul_figures() -> dict[str, float]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((1024, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    x = rng.standard_normal((64, 512), dtype=np.float32)
    layers = [(rng.standard_normal((512, 1408), dtype=np.float32) / 23, rng.standard_normal((1408, 512),
               dtype=np.float32) / 38, 1 + rng.standard_normal(512, dtype=np.float32) / 10) for _ in range(8)]

    def chain64(h: np.ndarray) -> np.ndarray:
        h = h.astype(np.float64)
        for up, down, scale in layers:
            n = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + 1e-6) * scale
            u = n @ up
            h = h + (u / (1 + np.exp(-u))) @ down
        return h

    @jax.jit
    def chain(h: jax.Array) -> jax.Array:
        for up, down, scale in layers:
            n = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * scale
            h = h + jax.nn.silu(n @ up) @ down
        return h

    out: dict[str, float] = {}
    ref_chain = chain64(x)
    for precision in ("default", "high", "highest"):
        with jax.default_matmul_precision(precision):
            got = np.asarray(jax.jit(lambda p, q: p @ q)(a, b), dtype=np.float64)
            deep = np.asarray(chain(x), dtype=np.float64)
        out[f"matmul_{precision}"] = float(np.max(np.abs(got - exact)) / np.max(np.abs(exact)))
        out[f"chain8_{precision}"] = float(np.max(np.abs(deep - ref_chain)) / np.max(np.abs(ref_chain)))
    return out


def parity_figures(layers: int, root: Path) -> dict[str, object]:
    import torch
    import transformers

    from guard.cli import main as guard_main

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=704,
                                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                                      max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # randomized norms, so a wrong scale cannot hide behind ones
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
    pt_dir, flax_dir = root / f"llama{layers}", root / f"llama{layers}-flax"
    model.save_pretrained(pt_dir)
    assert guard_main(["convert", str(pt_dir), "--to", "flax", "--out", str(flax_dir)]) == 0
    report = root / f"parity{layers}.json"
    start = time.perf_counter()
    code = guard_main(["parity", str(pt_dir), str(flax_dir), "--drift", "-f", "json", "-o", str(report)])
    seconds = time.perf_counter() - start
    figures = json.loads(report.read_text())["extra"]["parity"]
    fp32 = next(c for c in figures["comparisons"] if c["name"].startswith("fp32") or "fp32" in c["name"])
    return {"layers": layers, "exit": code, "passed": figures["passed"], "seconds": round(seconds, 1),
            "backend": figures.get("jax_backend"), "device": figures.get("jax_device"),
            "fp32_logits_max_rel": fp32["outputs"]["logits"]["max_rel"],
            "drift": figures.get("default_precision_drift")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,8")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import jax

    result: dict[str, object] = {"jax": jax.__version__, "backend": jax.default_backend(),
                                 "device": jax.devices()[0].device_kind, "matmul": matmul_figures()}
    print(json.dumps(result, indent=1), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        result["parity"] = [parity_figures(int(n), Path(tmp)) for n in args.layers.split(",")]
    print(json.dumps(result["parity"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
