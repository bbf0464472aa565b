"""Benchmark: `ckpt-guard convert --to maxtext` against MaxText 0.2.5's own `to_maxtext` (lazy mode).

The model is bench/convert.py's 12-layer 1.48 GB bf16 Llama, its config given llama3 RoPE scaling (MaxText's
own factors) so that both sides write the same `llama3.1-8b` layout (query/key RoPE interleave, query scale),
unscanned.  MaxText's converter takes its sizes from its HF_MODEL_CONFIGS table; the same overrides `convert`
prints are passed to it, as a user would.  Whole processes, alternating, wall time and peak RSS from os.wait4.

MaxText 0.2.5's to_maxtext fails at its save with orbax-checkpoint 0.12.8 (NoEntryError); its own requirement is
``orbax-checkpoint>=0.12.4``, so its Python here is a venv that adds orbax-checkpoint 0.12.4 over `.venv-maxtext`::

    python3.12 -m venv /tmp/mt-orbax
    echo "$PWD/.venv-maxtext/lib/python3.12/site-packages" > /tmp/mt-orbax/lib/python3.12/site-packages/zz.pth
    /tmp/mt-orbax/bin/python -m pip install --no-deps orbax-checkpoint==0.12.4
    python bench/maxtext_own.py --maxtext-python /tmp/mt-orbax/bin/python [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_convert", ROOT / "bench" / "convert.py")
assert _spec is not None and _spec.loader is not None
convert_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert_bench)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def llama3_source(work: Path) -> Path:
    """The bench model's weights (linked, not copied) under a config with MaxText's llama3 RoPE scaling."""
    model = convert_bench.ensure_model(12)
    src = work / "src"
    src.mkdir(parents=True)
    (src / "model.safetensors").symlink_to((model / "model.safetensors").resolve())
    config = json.loads((model / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "rope_scaling": LLAMA3_ROPE,
                                                 "max_position_embeddings": 16384}))
    return src


def size_flags(src: Path) -> list[str]:
    """The overrides `convert --to maxtext` prints (model_name and load path left to each side)."""
    sys.path.insert(0, str(ROOT))
    from guard.convert.maxtext.flags import maxtext_flags
    from guard.convert.maxtext.table import ARCHITECTURES

    flags = maxtext_flags(ARCHITECTURES["llama3"], json.loads((src / "config.json").read_text()), items=src,
                          scan=False)
    return [f for f in flags if not f.startswith(("model_name=", "load_parameters_path=", "scan_layers="))]


def run_logged(argv: list[str], log: Path) -> tuple[float, int]:
    """bench/convert.py's run_child, stderr to a file (to_maxtext logs more than a pipe holds)."""
    import os
    import subprocess
    import time

    env = {**os.environ, "CI": "true", "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=err, stderr=err, cwd=ROOT)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{argv[:4]} failed: see {log}")
    return wall, usage.ru_maxrss * 1024  # Linux reports KiB


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maxtext-python", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = ROOT / "bench" / "out" / "maxtext-own"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    src = llama3_source(work)
    theirs = [str(args.maxtext_python), "-m", "maxtext.checkpoint_conversion.to_maxtext", "model_name=llama3.1-8b",
              "scan_layers=false", "skip_jax_distributed_system=true", f"hf_model_path={src}",
              "--lazy_load_tensors=True", *size_flags(src)]
    cmds = {"ckpt-guard convert --to maxtext": lambda out: [sys.executable, "-m", "guard", "convert", str(src), "--to",
                                                            "maxtext", "--out", str(out)],
            "MaxText to_maxtext (lazy)": lambda out: [*theirs, f"base_output_directory={out}"]}
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in cmds}
    for round_ in range(args.rounds):
        for index, (name, argv) in enumerate(cmds.items()):
            out = work / f"out-{round_}-{index}"
            runs[name].append(run_logged(argv(out), work / f"log-{round_}-{index}.txt"))
            if not (out / "0" / "items").is_dir():
                raise SystemExit(f"{name}: wrote no {out / '0' / 'items'}")
            shutil.rmtree(out, ignore_errors=True)
    ours, own = (convert_bench.median_run(runs[name]) for name in cmds)
    rows = ["| command | wall s | peak RSS MB |", "|---|---:|---:|"]
    rows += [f"| {name} | {w:.2f} | {r / 2**20:.0f} |" for name, (w, r) in zip(cmds, (ours, own))]
    print(f"median of {args.rounds}\n" + "\n".join(rows))
    print(f"time ratio {ours[0] / own[0]:.3f}x, peak memory ratio {ours[1] / own[1]:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
