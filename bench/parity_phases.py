"""Where `ckpt-guard convert --parity` spends its time on a tiny model (issue 46 item 5), phase by phase.

The model: a 107K-parameter Llama (hidden 64, 2 layers, 256-token vocabulary, untied head) saved in bf16 by
this transformers, so parity runs all four passes.  The Flax side runs in the transformers-4 environment
(``--flax-python``, default: the managed tf4 one, `ckpt-guard env install tf4`).  Each figure is the median of
``--rounds`` child processes, alternating:

- whole runs: `convert` alone; `convert --parity` with the ckpt-guard of each ``--before TREE`` (the package of
  an older commit: `mkdir /tmp/b && git archive 6f99503^ guard | tar -x -C /tmp/b`) and of this tree, the
  latter with a cold JAX compilation cache (an empty one each run) and a warm one;
- interpreter start of each Python (`-c pass`);
- imports of each side, less the interpreter start: the PyTorch side here (torch, transformers' config and
  PyTorch class) before (as transformers imports them) and now (hqq, torchao and kernels hidden:
  ``guard.parity.unneeded``); the Flax side before (transformers 4 as it imports with torch and TensorFlow
  installed, the PyTorch twin the worker built its blocks from, the PyTorch auto mapping) and now
  (``USE_TORCH=0 USE_TF=0``, what ``guard.worker.flax_side.warm`` imports);
- the Flax side's passes (fp32, bf16: ``guard.worker.flax_side._passes``) in a child with an empty compilation
  cache and with a warm one: the difference is JAX's compilation;
- the transfers: the worker writing its arrays (inputs, outputs, every block's output) and the parent reading
  them back (``guard.envs.protocol``).

Each row gives the wall time and the CPU time (user + system; a whole run's includes its worker's).  On a
loaded machine the CPU time is the steadier figure: the wall time is mostly waiting for a core.

    python bench/parity_phases.py [--rounds 3] [--before /tmp/b ...] [--flax-python PATH] [--runs-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

LLAMA: dict[str, Any] = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "tie_word_embeddings": False}
TORCH_SIDE_IMPORTS = "import torch, transformers; transformers.AutoConfig; transformers.LlamaForCausalLM"
# as the parent imports them now: transformers' hqq, torchao and kernels hidden (guard.parity.unneeded)
TORCH_SIDE_NOW = f"from guard.parity.unneeded import hidden\nwith hidden():\n    {TORCH_SIDE_IMPORTS}"
FLAX_BEFORE_IMPORTS = ("import jax, flax, transformers; transformers.FlaxLlamaForCausalLM; "
                       "from transformers.models.auto import modeling_auto, modeling_flax_auto; "
                       "transformers.LlamaForCausalLM")
FLAX_NOW_IMPORTS = ("import guard.worker.flax_side as side; side.warm(); import transformers; "
                    "transformers.FlaxLlamaForCausalLM")
FLAX_ENV = {"USE_TORCH": "0", "USE_TF": "0"}
# run in the transformers-4 Python: the Flax side's passes as the worker runs them, timed, arrays written
PASSES = """
import json, sys, time
from pathlib import Path
request = json.loads(sys.argv[1])
start, start_cpu = time.perf_counter(), time.process_time()
from guard.worker import flax_side
flax_side.warm()
import transformers
from guard.parity.inputs import make_inputs
from guard.envs.protocol import write_array
imported, imported_cpu = time.perf_counter(), time.process_time()
flax_cls = transformers.FlaxLlamaForCausalLM
config = transformers.AutoConfig.from_pretrained(request["flax_dir"])
inputs = make_inputs(config, flax_cls, seed=0)
passes = [("flax:fp32", "F32"), ("flax:stored", "BF16")]
runs, modules, how = flax_side._passes(flax_cls, request["units"], "LlamaForCausalLM", config,
                                       Path(request["flax_dir"]), passes, inputs)
ran, ran_cpu = time.perf_counter(), time.process_time()
out = Path(request["out_dir"])
records = [write_array(v, out, f"i{i}") for i, v in enumerate(inputs.values())]
for n, outputs in enumerate([*runs.values(), *modules.values()]):
    records += [write_array(v, out, f"r{n}-{i}") for i, v in enumerate(outputs.values())]
written, written_cpu = time.perf_counter(), time.process_time()
assert how["streamed"], how
print(json.dumps({"imports": [imported - start, imported_cpu - start_cpu],
                  "passes": [ran - imported, ran_cpu - imported_cpu],
                  "write": [written - ran, written_cpu - ran_cpu], "records": records}))
"""


def child(argv: list[str], env: dict[str, str] | None = None, *, pythonpath: Path = ROOT) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds: user + system of the child and every descendant it waited for, such as
    parity's worker, stdout).  On a loaded machine the CPU seconds are the steadier figure: the wall time is
    mostly waiting for a core."""
    import resource

    environment = {**os.environ, "CI": "true", "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu",
                   "PYTHONPATH": str(pythonpath), **(env or {})}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # run from the tree: `python -m` puts the working directory first on the path, ahead of PYTHONPATH
    done = subprocess.run(argv, env=environment, capture_output=True, text=True, cwd=pythonpath)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0,):
        raise SystemExit(f"{argv[:6]} failed:\n{done.stderr[-3000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, done.stdout


def tiny_llama(directory: Path) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    model.to(torch.bfloat16).save_pretrained(directory)
    return directory


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, action="append", default=[],
                        help="a checkout of a ckpt-guard to compare with (repeatable; rows named by its folder)")
    parser.add_argument("--flax-python", type=Path, default=None)
    parser.add_argument("--runs-only", action="store_true", help="whole runs alone, no phase")
    args = parser.parse_args()
    from guard.envs.find import find

    tf4 = args.flax_python or find("tf4").python
    here = Path(sys.executable)
    work = Path(tempfile.mkdtemp(prefix="parity-phases-"))
    try:
        return _bench(args, here, tf4, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(args: argparse.Namespace, here: Path, tf4: Path, work: Path) -> int:
    from guard.parity.legacy_flax import _torch_units

    src = tiny_llama(work / "src")
    flax_dir = work / "flax"
    child([str(here), "-m", "guard", "convert", str(src), "--to", "flax", "--out", str(flax_dir)])
    import transformers

    config = json.loads((src / "config.json").read_text())
    units = _torch_units(config, transformers.AutoConfig.from_pretrained(src))[0]["LlamaForCausalLM"]
    warm_home = work / "warm-home"
    print(f"python here: {here}\nFlax side: {tf4}\nload average before: {load_average()}", flush=True)
    samples: dict[str, list[tuple[float, float]]] = {}

    def add(key: str, timed: tuple[float, float, str] | list[float] | float) -> None:
        seconds = (timed[0], timed[1]) if isinstance(timed, tuple | list) else (timed, float("nan"))
        samples.setdefault(key, []).append(seconds)
        print(f"  {key}: {seconds[0]:.2f} s, CPU {seconds[1]:.2f} s (load {load_average()})", flush=True)

    def convert(key: str, *extra: str, tree: Path = ROOT, home: Path | None = None) -> None:
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        env = {"CKPT_GUARD_HOME": str(home or Path(tempfile.mkdtemp(dir=work, prefix="home-")))}
        add(key, child([str(here), "-m", "guard", "convert", str(src), "--to", "flax", "--out", str(out), *extra],
                       env, pythonpath=tree))

    parity = ("--parity", "--flax-python", str(tf4))
    convert("untimed", *parity, home=warm_home)  # the page cache for every library, and the warm cache's programs
    for _ in range(args.rounds):
        convert("convert alone")
        for tree in args.before:
            convert(f"convert --parity, {tree.name}, warm compilation cache", *parity, tree=tree, home=warm_home)
        convert("convert --parity, now, cold compilation cache", *parity)
        convert("convert --parity, now, warm compilation cache", *parity, home=warm_home)
        if args.runs_only:
            continue
        add("start: this Python", child([str(here), "-c", "pass"]))
        add("start: the transformers-4 Python", child([str(tf4), "-c", "pass"]))
        add("imports: PyTorch side, before", child([str(here), "-c", TORCH_SIDE_IMPORTS]))
        add("imports: PyTorch side, now", child([str(here), "-c", TORCH_SIDE_NOW]))
        add("imports: Flax side, before", child([str(tf4), "-c", FLAX_BEFORE_IMPORTS]))
        add("imports: Flax side, now", child([str(tf4), "-c", FLAX_NOW_IMPORTS], FLAX_ENV))
        for cache, home in (("cold", None), ("warm", warm_home)):
            out = Path(tempfile.mkdtemp(dir=work, prefix="arrays-"))
            env = {**FLAX_ENV, "CKPT_GUARD_HOME": str(home or Path(tempfile.mkdtemp(dir=work, prefix="home-")))}
            answer = json.loads(child([str(tf4), "-c", PASSES, json.dumps(
                {"flax_dir": str(flax_dir), "units": units, "out_dir": str(out)})], env)[2].splitlines()[-1])
            add(f"Flax passes (fp32, bf16), {cache} compilation cache", answer["passes"])
            if cache == "warm":
                add("transfers: worker writes its arrays", answer["write"])
                add("transfers: parent reads them back", _read_back(answer["records"], out))
    rows = {key: (statistics.median(v[0] for v in values), statistics.median(v[1] for v in values))
            for key, values in samples.items() if key != "untimed"}

    def less(key: str, start: str) -> None:
        rows[key] = (rows[key][0] - rows[start][0], rows[key][1] - rows[start][1])

    if not args.runs_only:
        less("imports: PyTorch side, before", "start: this Python")
        less("imports: PyTorch side, now", "start: this Python")
        less("imports: Flax side, before", "start: the transformers-4 Python")
        less("imports: Flax side, now", "start: the transformers-4 Python")
        cold, warm = (rows[f"Flax passes (fp32, bf16), {c} compilation cache"] for c in ("cold", "warm"))
        rows["JAX compilation (cold less warm)"] = (cold[0] - warm[0], cold[1] - warm[1])
    print(f"load average after: {load_average()}; medians of {args.rounds}")
    for key, (wall, cpu) in rows.items():
        print(f"{key:<60} {wall:7.2f} s  CPU {cpu:7.2f} s")
    return 0


def _read_back(records: list[dict[str, Any]], out: Path) -> list[float]:
    from guard.envs.protocol import read_array

    start, start_cpu = time.perf_counter(), time.process_time()
    for record in records:
        read_array(record, out)
    return [time.perf_counter() - start, time.process_time() - start_cpu]


if __name__ == "__main__":
    raise SystemExit(main())
