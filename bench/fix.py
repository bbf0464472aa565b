"""Benchmark: `ckpt-guard fix` on a pickle-only pytorch_model.bin against the convert bot's path and `cp`.

A 1.5 GB fp32 Llama-style state dict (hidden 1024, 20 layers, vocab 32000, lm_head tied to the
embedding, so one storage has two names) written with torch.save into bench/out/fix/.  Then,
alternating, whole processes on the same disk, page cache warm (dropping caches needs root):

  cp:          cp pytorch_model.bin X                     (coreutils: copy_file_range, no fsync)
  cp + sync:   cp pytorch_model.bin X && sync X
  fix:         scan, plan CG008, stage model.safetensors, verify, publish (rename), fsynced
  torch:       torch.load(weights_only=True), tied names removed, safetensors.torch.save_file
               (the Hub convert bot's core, without its reload check; no fsync)

Each child's wall time and peak RSS come from os.wait4 (bench/convert.py's run_child).  Targets:
fix <= 0.5x the torch path's time and <= 3x `cp`; peak RSS <= 2x the largest tensor + 300 MB (the
bound convert meets).  Nothing is asserted: the figures are printed, and with --write-docs go into
the "## Fix" section of docs/benchmarks.md.

    nice python bench/fix.py [--rounds 5] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convert as convert_bench  # noqa: E402  (run_child, load_average, evict)

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "out" / "fix"
HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 1024, 4096, 20, 32000

GENERATE = """
import json, sys, torch
from pathlib import Path
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
h, i, layers, vocab = map(int, sys.argv[2:6])
g = torch.Generator().manual_seed(0)
def w(*shape):
    return torch.randn(*shape, generator=g) * 0.02
embed = w(vocab, h)
state = {"model.embed_tokens.weight": embed}
for n in range(layers):
    p = f"model.layers.{n}."
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        state[p + f"self_attn.{name}.weight"] = w(h, h)
    state[p + "mlp.gate_proj.weight"] = w(i, h)
    state[p + "mlp.up_proj.weight"] = w(i, h)
    state[p + "mlp.down_proj.weight"] = w(h, i)
    state[p + "input_layernorm.weight"] = torch.ones(h)
    state[p + "post_attention_layernorm.weight"] = torch.ones(h)
state["model.norm.weight"] = torch.ones(h)
state["lm_head.weight"] = embed  # tied: one storage, two names, as save_pretrained(safe_serialization=False) writes
torch.save(state, out / "pytorch_model.bin")
(out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": h, "intermediate_size": i, "num_hidden_layers": layers, "vocab_size": vocab,
    "tie_word_embeddings": True, "torch_dtype": "float32"}))
"""

# Ours, as a user runs it: `ckpt-guard fix --write` when the command exists, else the same steps through the
# library (scan, plan, stage, publish by rename, fsync the directory).
OURS = """
import os, shutil, sys
from pathlib import Path
from guard.config import Policy
from guard.fix.actions import stage
from guard.fix.context import ActionContext, FixOptions
from guard.scan import scan_paths
model = Path(sys.argv[1])
(finding,) = [f for f in scan_paths([model], Policy()).findings if f.code == "CG008"]
staging = model / f".ckpt-guard-fix-{os.getpid()}"
staging.mkdir()
try:
    staged = stage(finding.fix, ActionContext(model, staging, FixOptions(write=True), Policy()))
    assert not [f for f in staged.findings if f.severity.value == "error"], staged.findings
    for temp, final in staged.files:
        os.replace(temp, final)
    fd = os.open(model, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
finally:
    shutil.rmtree(staging)
"""

TORCH = """
import sys, torch
from safetensors.torch import _remove_duplicate_names, save_file
loaded = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
for kept, names in _remove_duplicate_names(loaded).items():
    for name in names:
        del loaded[name]
save_file({k: v.contiguous() for k, v in loaded.items()}, sys.argv[2], metadata={"format": "pt"})
"""


def ensure_model() -> Path:
    src = WORK / "src"
    if not (src / "pytorch_model.bin").is_file():  # in a child: a forked child's peak RSS starts at ours
        print(f"generating {src} ...", flush=True)
        convert_bench.run_child([sys.executable, "-c", GENERATE, str(src), str(HIDDEN), str(INTERMEDIATE),
                                 str(LAYERS), str(VOCAB)])
    return src


def fix_command() -> list[str]:
    if (ROOT / "guard" / "cli" / "fix.py").is_file() and (ROOT / "guard" / "fix" / "apply.py").is_file():
        return [sys.executable, "-m", "guard", "fix", "--write", "--select", "CG008"]
    return [sys.executable, "-c", OURS]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    src = ensure_model()
    weights = src / "pytorch_model.bin"
    out = WORK / "out.safetensors"
    ours = fix_command()
    cmds = {
        "cp": ["cp", str(weights), str(out)],
        "cp + sync": ["sh", "-c", 'cp "$0" "$1" && sync "$1"', str(weights), str(out)],
        "ckpt-guard fix": [*ours, str(src)],
        "torch.load + save_file": [sys.executable, "-c", TORCH, str(weights), str(out)],
    }
    convert_bench.run_child(["cat", str(weights)])  # warm in the page cache
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in cmds}
    before = convert_bench.load_average()
    for i in range(args.rounds):
        for name, cmd in cmds.items():
            clean(src, out)
            convert_bench.run_child(["sync"])  # no earlier run's dirty pages left to compete for the disk
            runs[name].append(convert_bench.run_child(cmd))
            wall, rss = runs[name][-1]
            print(f"round {i + 1} {name:<24} {wall:7.2f} s  peak RSS {rss / 1e6:8.1f} MB", flush=True)
            if name == "ckpt-guard fix" and i == 0:
                check_output(src)
    clean(src, out)
    medians = {name: (statistics.median(r[0] for r in rs), int(statistics.median(r[1] for r in rs)))
               for name, rs in runs.items()}
    figures = {"rounds": args.rounds, "cpus": os.cpu_count(), "bytes": weights.stat().st_size,
               "largest_tensor": VOCAB * HIDDEN * 4,
               "command": "the library steps of OURS" if "-c" in ours else " ".join(["python", *ours[1:]]),
               "load_before": before, "load_after": convert_bench.load_average(),
               "runs": {name: {"wall_s": m[0], "peak_rss": m[1], "all_wall_s": [round(r[0], 2) for r in runs[name]]}
                        for name, m in medians.items()}}
    print(json.dumps(figures, indent=2))
    if args.write_docs:
        write_docs(figures)
    return 0


def clean(src: Path, out: Path) -> None:
    for path in [*src.glob("*.safetensors*"), out]:
        path.unlink(missing_ok=True)
    for path in src.glob(".ckpt-guard-fix-*"):
        shutil.rmtree(path, ignore_errors=True)


def check_output(src: Path) -> None:
    """The last run's output holds every name but the tied one (not timed)."""
    from guard.readers import scan_file
    from guard.sources import LocalFile

    with LocalFile(src / "model.safetensors") as source:
        names = {t.name for t in scan_file(source).tensors}
    assert len(names) == 9 * LAYERS + 2 and "lm_head.weight" not in names, len(names)


def write_docs(f: dict) -> None:  # type: ignore[type-arg]
    """Replace (or add) the `## Fix` section of docs/benchmarks.md, leaving the others alone."""
    runs = f["runs"]
    cp, sync, ours, torch = (runs[n]["wall_s"] for n in ("cp", "cp + sync", "ckpt-guard fix",
                                                          "torch.load + save_file"))
    target = 2 * f["largest_tensor"] + 300e6
    lines = [
        "## Fix", "",
        f"`nice python bench/fix.py --rounds {f['rounds']} --write-docs`: a pickle-only `pytorch_model.bin` of "
        f"{f['bytes'] / 1e9:.2f} GB written by `torch.save` (fp32, Llama-style: hidden {HIDDEN}, {LAYERS} layers, "
        f"vocab {VOCAB}; `lm_head.weight` tied to the embedding; largest tensor the "
        f"{f['largest_tensor'] / 1e6:.0f} MB embedding) turned into `model.safetensors`. Whole processes, "
        f"alternating within each round, page cache warm, median of {f['rounds']} rounds; peak RSS from each "
        f"child's own rusage; {f['cpus']} CPUs. ckpt-guard ran as `{f['command']}`.", "",
        "| command | wall | x `cp` | x torch path | peak RSS | RSS target |",
        "|---|---:|---:|---:|---:|---:|",
        f"| `cp` | {cp:.2f} s | 1.0 | | {runs['cp']['peak_rss'] / 1e6:.0f} MB | |",
        f"| `cp` + `sync FILE` | {sync:.2f} s | {sync / cp:.1f} | | | |",
        f"| ckpt-guard fix (scan, stage, verify, publish, fsync) | {ours:.2f} s | **{ours / cp:.1f}** | "
        f"**{ours / torch:.2f}** | {runs['ckpt-guard fix']['peak_rss'] / 1e6:.0f} MB | {target / 1e6:.0f} MB |",
        f"| `torch.load(weights_only=True)` + `save_file` | {torch:.2f} s | {torch / cp:.1f} | 1.0 | "
        f"{runs['torch.load + save_file']['peak_rss'] / 1e6:.0f} MB | |",
        "", f"Load average (1, 5, 15 min) before / after: {f['load_before']} / {f['load_after']}.", "", NOTES, "",
    ]
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    section = "\n".join(lines)
    pattern = re.compile(r"^## Fix\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _m: section + "\n", text) if pattern.search(text) else \
        text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


NOTES = """\
Targets: at most 0.5x the torch path's wall time, at most 3x `cp` of the same bytes to the same disk, and
peak RSS at most 2x the largest tensor + 300 MB. The torch path is the Hub convert bot's core
(`torch.load(weights_only=True)`, `_remove_duplicate_names`, `save_file(metadata={"format": "pt"})`), without
its reload-and-compare check and without an fsync; ckpt-guard fsyncs the file and the directory before the
rename that publishes it, so `cp` + `sync FILE` is the like-for-like floor.

Nothing is unpickled and no tensor is held: the scanner's own reader places each storage of the zip (one
local-header read each), and every contiguous tensor is a byte range the writer thread copies without Python
touching a byte. The tied `lm_head.weight` is written once, under the embedding's name. Where the source and
output offsets line up modulo the page size the range goes through `copy_file_range`; torch aligns storages to
64 bytes, so here they never line up with a safetensors body, and a misaligned `copy_file_range` splices page
fragments one at a time: 1.3-1.5x slower than `write()` from a read-only mapping of the source on this ext4
disk. Those ranges are therefore written from 64 MiB mapped windows (the peak RSS: one window plus the
interpreter and numpy); before that change the fix took 3.6x `cp` (1.72 s against 0.48 s). What is left above
`cp` + `sync`: ~0.3 s interpreter, click and numpy, the scan before and the re-scan after (~0.1 s together),
CG301 verification (scanner re-read, placements, 32 sampled elements per tensor against the source, ~0.1 s).
The torch path holds the whole state dict, then a second copy of it as `save_file` builds its buffer.

This machine is a 2-vCPU VM shared with other engineers' test runs (load averages above): single runs vary by
up to 50 %, so the rounds alternate every command and the table gives medians, with each run in the JSON the
script prints."""


if __name__ == "__main__":
    raise SystemExit(main())
