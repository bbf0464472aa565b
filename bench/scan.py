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

At scale (``--cases scale``): a sharded index of 4,000 shards x 50 tensors (200,000 tensors), the
whole `ckpt-guard scan DIR` process against a fresh interpreter listing every dtype of the same
shards with `safe_open` (target: at most 1.5x, peak RSS at most 100 MB), and the same at 1,000
shards to show the cost per tensor stays flat.

Discovery (``--cases discovery``): a tree of 50,000 non-weight files (sources, configs, images,
data) plus one model, `ckpt-guard scan TREE` against `find TREE -type f` (target: at most 5x).

Loading (``--cases loading``): where the loading rules (CG123-CG127) judge a set at scale: a per-expert
Qwen3-MoE (config.json naming ``Qwen3MoeForCausalLM``, 128 layers of 512 experts: 197,763 tensors that
all match the table, in 100 shards), ``ckpt-guard scan DIR`` against the same scan with those rules
ignored (``--ignore CG123,...,CG127``), and the same model with experts 2-3 left out of layer 0 (the
judge's finding path). Target: the rules add at most 5 %.

Usage: .venv/bin/python bench/scan.py [--size-gib 1.0] [--rounds 7] [--out bench/out/scan]
                                      [--cases loaders layout scale discovery loading]

Every case runs ckpt-guard and the references with the interpreter that runs this script: with
`.venv-latest/bin/python` (`make bench-latest`) it measures the latest releases (bench/envs.py).
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
    """A file of zeros written by safetensors itself: its compact header, its tensor order."""
    import numpy as np
    from safetensors.numpy import save_file

    kind = {"F32": np.float32, "F16": np.float16}[dtype]
    save_file({f"down_blocks.{i // 8}.resnets.{i % 8}.conv.weight": np.zeros((4096,), kind) for i in range(tensors)},
              str(path), metadata={"format": "pt"})


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
    parser.add_argument("--cases", nargs="+", choices=("loaders", "layout", "scale", "discovery", "loading"),
                        default=["loaders", "layout", "scale", "discovery"])
    parser.add_argument("--generate-sharded", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--generate-moe", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--time-loading", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # An installed package runs from compiled bytecode; with PYTHONDONTWRITEBYTECODE set, every child
    # would compile each guard module from source again (a third of a tiny scan's start-up here).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.generate_sharded:
        generate_sharded(Path(args.generate_sharded[0]), int(args.generate_sharded[1]), 50,
                         form=(args.generate_sharded[2:] or ["library"])[0])
        return 0
    if args.time_loading:
        time_loading(args.time_loading)
        return 0
    if args.generate_moe:
        generate_moe(Path(args.generate_moe[0]), missing=args.generate_moe[1] == "missing")
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    import envs

    print(f"environment: {envs.describe()}")
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if "scale" in args.cases:
        scale(args.out, args.rounds)
    if "discovery" in args.cases:
        discovery(args.out, args.rounds)
    if "loading" in args.cases:
        loading(args.out, args.rounds)
    if "loaders" in args.cases:
        loaders(args)
    if "layout" in args.cases:
        layout_per_file(args.out, args.rounds)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def loaders(args: argparse.Namespace) -> None:
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


def generate_sharded(out: Path, shards: int, per_shard: int, *, form: str = "library") -> Path:
    """A sharded bf16 model: ``shards`` files of ``per_shard`` small tensors, its index, config.json, each
    written as its library writes it (compact safetensors headers; transformers' indented, sorted index).
    ``form`` "spaced": the headers as hand-rolled writers write them, ``json.dumps`` with its default
    separators; "sorted": ``json.dumps(sort_keys=True)``, each entry's ``data_offsets`` before its dtype (as
    valid a header); "indented": ``json.dumps(indent=2)``, a form no pattern lists (the JSON parse's columns);
    "distinct": the library's form, each shard's first tensor a width of its own, so no two shards share a
    layout (no template applies: every header is read in full, each with a shape and a tiling never met);
    "rotated": the library's form, each tensor of a layer a width of its own and each shard starting ten
    layers' worth of tensors at another place in the layer (as equal shards cut a model): ten layouts in
    turn, with shapes and tilings met before and buffers as long (the templates kept per buffer length read
    all but the first few)."""
    root = out / f"sharded-{shards}x{per_shard}{'' if form == 'library' else '-' + form}"
    if (root / ".built").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm", "rotary")
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for i in range(per_shard):
            at = i + shard % len(names) if form == "rotated" else i  # where in the layer this shard starts
            layer = shard * (per_shard // len(names) + 1) + at // len(names)
            name = f"model.layers.{layer}.{names[at % len(names)]}.weight"
            width = 4 + shard if form == "distinct" and i == 0 else 4 + at % len(names) if form == "rotated" else 4
            header[name] = {"dtype": "BF16", "shape": [8, width], "data_offsets": [offset, offset + 16 * width]}
            weight_map[name] = file
            offset += 16 * width
        # as the safetensors library writes it, or json.dumps' default form (", " and ": ")
        raw = (json.dumps(header) if form == "spaced" else json.dumps(header, sort_keys=True) if form == "sorted"
               else json.dumps(header, indent=2) if form == "indented"
               else json.dumps(header, separators=(",", ":"))).encode()
        raw += b" " * (-len(raw) % 8)
        (root / file).write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")  # as transformers does
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16"}))
    (root / ".built").touch()
    return root


def timed_rss(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds (user + system) of one whole process, run in bench/out.

    CPU time is the steadier figure on a shared machine: a loaded machine stretches wall time by
    the time a process waits for a core, CPU time much less."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=OUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{cmd[:4]} exited {code}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def scale(out: Path, rounds: int) -> None:
    """The whole scan of a 200k-tensor sharded index against a fresh safe_open listing of its shards."""
    py = sys.executable
    print("scale: whole processes, alternating, median wall time and peak RSS")
    per_tensor = []
    for shards, form in ((1000, "library"), (4000, "library"), (4000, "spaced"), (4000, "sorted"), (4000, "indented"),
                         (4000, "rotated"), (4000, "distinct")):
        # built in a child: a forked child's peak RSS starts at its parent's
        root = out / f"sharded-{shards}x50{'' if form == 'library' else '-' + form}"
        subprocess.run([py, __file__, "--generate-sharded", str(out), str(shards), form], check=True)
        if form == "spaced":
            print("  the same shards with json.dumps headers (\", \" and \": \"), as hand-rolled writers write them:")
        if form == "sorted":
            print("  the same shards with json.dumps(sort_keys=True) headers (data_offsets first):")
        if form == "indented":
            print("  the same shards with json.dumps(indent=2) headers (read through the JSON parse):")
        if form == "rotated":
            print("  library headers, ten layouts in turn (each shard starts at another place in its layer):")
        if form == "distinct":
            print("  library headers, no two shards of one layout (each header read in full, no template):")
        cmds = {
            "ckpt-guard scan": [py, "-m", "guard", "scan", "--expect", "config", "--no-summary", str(root)],
            "safe_open listing": [py, "-c", "import glob\nfrom safetensors import safe_open\n"
                                  f"for p in sorted(glob.glob({str(root)!r} + '/*.safetensors')):\n"
                                  "    with safe_open(p, framework='numpy') as f:\n"
                                  "        [f.get_slice(k).get_dtype() for k in f.keys()]"],
            "python -c pass": [py, "-c", "pass"],
        }
        wall, cpu, rss = alternated(cmds, rounds)
        tensors = shards * 50
        for name in cmds:
            print(f"  {shards} shards x 50 ({tensors:,} tensors)  {name:<20} wall {wall[name] * 1000:6.0f} ms"
                  f"  cpu {cpu[name] * 1000:6.0f} ms  peak RSS {rss[name] / 1e6:6.1f} MB")
        ratio = wall["ckpt-guard scan"] / wall["safe_open listing"]
        cpu_ratio = cpu["ckpt-guard scan"] / cpu["safe_open listing"]
        work = (cpu["ckpt-guard scan"] - cpu["python -c pass"]) / tensors * 1e6
        if form == "library":
            per_tensor.append(work)
        print(f"  ckpt-guard / safe_open: wall {ratio:.2f}x, cpu {cpu_ratio:.2f}x (target <= 1.5x); "
              f"{work:.2f} us of cpu per tensor above start-up")
    print(f"  cpu per tensor, 4,000 shards / 1,000 shards: {per_tensor[1] / per_tensor[0]:.2f} (linear: ~1.0)")


MOE_CONFIG = {  # Qwen3-MoE as transformers 5.25 writes it (Qwen3-235B-A22B's fields), sized for headers only
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "dtype": "bfloat16",
    "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
    "intermediate_size": 16, "moe_intermediate_size": 2, "num_local_experts": 512, "num_experts_per_tok": 8,
    "num_hidden_layers": 128, "vocab_size": 32, "tie_word_embeddings": False, "mlp_only_layers": [],
    "decoder_sparse_step": 1, "norm_topk_prob": True, "rms_norm_eps": 1e-06, "max_position_embeddings": 40960,
    "transformers_version": "5.25.0",
}


def moe_tensors(config: dict[str, object], *, missing: bool = False) -> list[tuple[str, list[int]]]:
    """A per-expert Qwen3-MoE's names and shapes in the Hub's order (as its shards list them)."""
    h, heads, kv, hd = (int(config[k]) for k in  # type: ignore[call-overload]  # the literal's ints
                        ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"))
    inter, experts, vocab = (int(config[k]) for k in  # type: ignore[call-overload]  # as above
                             ("moe_intermediate_size", "num_local_experts", "vocab_size"))
    out: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [vocab, h])]
    for layer in range(int(config["num_hidden_layers"])):  # type: ignore[call-overload]  # as above
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", [h]), (p + "mlp.gate.weight", [experts, h])]
        for e in range(experts):
            if missing and layer == 0 and e in (2, 3):
                continue  # an expert-parallel save that never gathered them
            out += [(f"{p}mlp.experts.{e}.down_proj.weight", [h, inter]),
                    (f"{p}mlp.experts.{e}.gate_proj.weight", [inter, h]),
                    (f"{p}mlp.experts.{e}.up_proj.weight", [inter, h])]
        out += [(p + "post_attention_layernorm.weight", [h]), (p + "self_attn.k_norm.weight", [hd]),
                (p + "self_attn.k_proj.weight", [kv * hd, h]), (p + "self_attn.o_proj.weight", [h, heads * hd]),
                (p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.q_proj.weight", [heads * hd, h]),
                (p + "self_attn.v_proj.weight", [kv * hd, h])]
    return out + [("model.norm.weight", [h]), ("lm_head.weight", [vocab, h])]


def generate_moe(out: Path, *, shards: int = 100, missing: bool = False) -> Path:
    """The per-expert Qwen3-MoE of ``moe_tensors`` in ``shards`` safetensors files (compact headers as the library
    writes them, zeros for data), its index and config.json; ``missing``: layer 0's experts 2-3 left out."""
    root = out / f"moe-{'missing' if missing else 'whole'}"
    if (root / ".built").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    tensors = moe_tensors(MOE_CONFIG, missing=missing)
    per_shard = -(-len(tensors) // shards)
    return write_bf16_shards(root, [tensors[shard * per_shard:(shard + 1) * per_shard] for shard in range(shards)],
                             MOE_CONFIG)


def write_bf16_shards(root: Path, shards: list[list[tuple[str, list[int]]]], config: dict[str, object]) -> Path:
    """``shards`` (each a list of (name, shape)) as save_pretrained shards them: bf16 safetensors files with compact
    headers and zeros for data, the index, config.json, and the ``.built`` mark the generators look for."""
    weight_map: dict[str, str] = {}
    total = 0
    for number, tensors in enumerate(shards):
        file = f"model-{number + 1:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in sorted(tensors):
            size = 2
            for dim in shape:
                size *= dim
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
            weight_map[name] = file
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        (root / file).write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (root / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (root / ".built").touch()
    return root


LOADING_CODES = "CG123,CG124,CG125,CG126,CG127"


def alternated(cmds: dict[str, list[str]], rounds: int) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """Each command once to warm up, then ``rounds`` rounds in alternating order: the median wall and CPU times
    and the largest peak RSS of each."""
    return medians(alternated_runs(cmds, rounds))


def alternated_runs(cmds: dict[str, list[str]], rounds: int) -> dict[str, list[tuple[float, int, float]]]:
    """Each command once to warm up, then ``rounds`` rounds in alternating order: each run's (wall, peak RSS,
    CPU), round by round."""
    for cmd in cmds.values():
        timed_rss(cmd)
    runs: dict[str, list[tuple[float, int, float]]] = {name: [] for name in cmds}
    for i in range(rounds):
        for name in (list(cmds) if i % 2 == 0 else list(reversed(cmds))):
            runs[name].append(timed_rss(cmds[name]))
    return runs


def medians(runs: dict[str, list[tuple[float, int, float]]]
            ) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    wall = {n: statistics.median(w for w, _, _ in r) for n, r in runs.items()}
    cpu = {n: statistics.median(c for _, _, c in r) for n, r in runs.items()}
    rss = {n: max(m for _, m, _ in r) for n, r in runs.items()}
    return wall, cpu, rss


def loading(out: Path, rounds: int) -> None:
    """The scan of a 197,763-tensor per-expert MoE whose config names its class, with and without the loading
    rules, whole processes alternating (CPU time the steadier figure on a shared machine); the ratio also as
    the median of each round's pair (a round's two runs share the machine's state of the moment), and the
    rules' own time inside the scan (``--time-loading``: their modules' import and each check, timed in the
    scan's process)."""
    py = sys.executable
    print("loading: per-expert Qwen3-MoE, 128 layers x 512 experts, 100 shards; whole processes, alternating")
    for kind in ("whole", "missing"):
        subprocess.run([py, __file__, "--generate-moe", str(out), kind], check=True)
        root = out.resolve() / f"moe-{kind}"
        scan = [py, "-m", "guard", "scan", "--expect", "config", "--no-summary", str(root)]
        base = "scan --ignore loading"
        cmds = {"scan": scan, base: [*scan, "--ignore", LOADING_CODES]}
        runs = alternated_runs(cmds, rounds)
        wall, cpu, rss = medians(runs)
        for name in cmds:
            print(f"  {kind:<8} {name:<22} wall {wall[name] * 1000:6.0f} ms  cpu {cpu[name] * 1000:6.0f} ms"
                  f"  peak RSS {rss[name] / 1e6:6.1f} MB")
        paired = statistics.median(a[2] / b[2] for a, b in zip(runs["scan"], runs[base]))
        print(f"  {kind:<8} with the rules / without: wall {wall['scan'] / wall[base]:.3f}x, "
              f"cpu {cpu['scan'] / cpu[base]:.3f}x, cpu paired by round {paired:.3f}x (target <= 1.05x)")
        shares = []
        for _ in range(rounds):
            proc = subprocess.run([py, __file__, "--time-loading", str(root)], capture_output=True, text=True, cwd=OUT)
            if proc.returncode not in (0, 1):  # 1: the scan's findings (the missing experts)
                raise SystemExit(f"--time-loading {root} exited {proc.returncode}: {proc.stderr[-500:]}")
            line = proc.stdout.splitlines()[-1].split()  # printed after the report
            shares.append((float(line[0]), float(line[1])))
        rules, total = (statistics.median(x) for x in zip(*shares))
        print(f"  {kind:<8} the rules inside the scan (imports and checks, median of {rounds}): {rules * 1000:.1f} ms "
              f"of {total * 1000:.0f} ms, {100 * statistics.median(r / t for r, t in shares):.1f} %")


def time_loading(root: str) -> None:
    """One scan of ``root`` as the command line runs it, printing the loading rules' own seconds (the import of
    their modules, and every check of CG123-CG127) and the whole run's, from the start of this process."""
    start = time.perf_counter()
    spent = [0.0]
    from guard import rules
    from guard.config import Policy
    from guard.findings import Finding
    from guard.inventory import ModelInventory

    def timed(check: rules.Check) -> rules.Check:
        def run(inventory: ModelInventory, policy: Policy) -> list[Finding]:
            t = time.perf_counter()
            found = list(check(inventory, policy))  # a generator's work is done when it is drained
            spent[0] += time.perf_counter() - t
            return found
        return run

    loading_codes = set(LOADING_CODES.split(","))
    rules.CHECKS = tuple((code, timed(check) if code in loading_codes else check) for code, check in rules.CHECKS)
    import guard.cli

    end = os._exit

    def report(code: int) -> None:
        print(f"{spent[0]:.6f} {time.perf_counter() - start:.6f}")
        sys.stdout.flush()
        end(code)

    os._exit = report  # type: ignore[assignment]  # the command line leaves through os._exit
    sys.argv = ["ckpt-guard", "scan", "--expect", "config", "--no-summary", root]
    guard.cli.main()


def generate_tree(out: Path, files: int = 50_000) -> Path:
    """``files`` non-weight files in nested folders (a source tree, docs, data) and one model folder."""
    root = out / f"tree-{files}"
    if (root / ".built").exists():
        return root
    suffixes = ("py", "md", "json", "txt", "png", "yaml", "c", "h", "js", "csv")
    for i in range(files):
        folder = root / f"pkg{i // 2500:02d}" / f"sub{(i // 100) % 25:02d}"
        if i % 100 == 0:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"file{i:05d}.{suffixes[i % len(suffixes)]}").write_bytes(b"x" * (i % 200))
    model = root / "models" / "tiny"
    model.mkdir(parents=True)
    _header_only_safetensors(model / "model.safetensors", "F32", 16)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float32"}))
    (root / ".built").touch()
    return root


def discovery(out: Path, rounds: int) -> None:
    """The scan of a big non-weight tree with one model in it, against `find` listing the same tree."""
    root = generate_tree(out)
    cmds = {
        "ckpt-guard scan TREE": [sys.executable, "-m", "guard", "scan", "--no-summary", str(root)],
        "find TREE -type f": ["find", str(root), "-type", "f"],
        "python -c pass": [sys.executable, "-c", "pass"],
    }
    for cmd in cmds.values():
        timed(cmd)
    runs: dict[str, list[float]] = {name: [] for name in cmds}
    for i in range(rounds):
        for name in (list(cmds) if i % 2 == 0 else list(reversed(cmds))):
            runs[name].append(timed(cmds[name]))
    med = {n: statistics.median(r) for n, r in runs.items()}
    print("discovery: 50,000 non-weight files and one model, whole processes, alternating, medians")
    for name, value in med.items():
        print(f"  {name:<24} {value * 1000:8.1f} ms")
    print(f"  ckpt-guard / find: {med['ckpt-guard scan TREE'] / med['find TREE -type f']:.2f}x (target <= 5x)")


if __name__ == "__main__":
    raise SystemExit(main())
