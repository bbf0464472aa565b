"""Benchmark: consolidating a PyTorch DCP checkpoint, `ckpt-guard convert` against `dcp_to_torch_save`.

The same ~174M-parameter Llama as bench/zero_consolidate.py (tests/deepspeed_writers.py's "175m" preset),
fp32, trained one step with AdamW and saved with `torch.distributed.checkpoint.save` in the DCP tutorial's
layout (`{"model": ..., "optim": ...}`: weights and both moments, about 2.1 GB).  Then, alternating,
whole processes:

  ckpt-guard:         python -m guard convert CKPT --to torch --out X --config CFG   (model.safetensors)
  dcp_to_torch_save:  torch.distributed.checkpoint.format_utils.dcp_to_torch_save(CKPT, X/ref.pt)

Each child's wall time and peak RSS come from os.wait4.  Targets (issue 30): time <= 1x and peak memory
<= 0.25x of dcp_to_torch_save; peak RSS <= 2x the largest tensor + 300 MB.  The outputs are compared
tensor by tensor once, bit for bit (the reference's `model` entry).

    python bench/dcp_consolidate.py [--rounds 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from convert import largest_tensor, median_run, run_child  # noqa: E402  (bench/convert.py: os.wait4 per child)

CACHE = ROOT / "bench" / "out" / "dcp-175m"
REFERENCE = ("import sys\nfrom torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n"
             "dcp_to_torch_save(sys.argv[1], sys.argv[2])\n")


def checkpoint() -> tuple[Path, Path, int]:
    """(the DCP folder, the folder of its config.json, the model's parameter count), written once, by a child:
    a child's peak RSS (os.wait4) counts the parent's resident pages at the fork, so the parent stays small."""
    done = CACHE / "run.json"
    if not done.is_file():
        run_child([sys.executable, __file__, "--write-checkpoint"])
    return CACHE / "ckpt", CACHE / "config", int(json.loads(done.read_text())["parameters"])


def write_checkpoint() -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from deepspeed_writers import PRESETS
    from transformers import LlamaConfig, LlamaForCausalLM

    shutil.rmtree(CACHE, ignore_errors=True)
    CACHE.mkdir(parents=True)
    print(f"writing {CACHE} with torch.distributed.checkpoint ...", flush=True)
    config = LlamaConfig(**PRESETS["175m"], tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=str(CACHE / "ckpt"))
    config.save_pretrained(CACHE / "config")
    (CACHE / "run.json").write_text(json.dumps({"parameters": model.num_parameters()}))


def assert_same_bits(ours: Path, reference: Path) -> None:
    """In a child, for the reason ``checkpoint`` gives; it exits 1 (and run_child stops the run) if they differ."""
    run_child([sys.executable, __file__, "--same-bits", str(ours), str(reference)])


def _same_bits(ours: Path, reference: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    mine, theirs = load_file(ours), torch.load(reference, weights_only=True)["model"]
    return set(mine) == set(theirs) and all(
        mine[k].dtype == v.dtype and mine[k].shape == v.shape
        and torch.equal(mine[k].view(torch.uint8), v.contiguous().view(torch.uint8)) for k, v in theirs.items())


def scan_bytes(ckpt: Path) -> int:
    """Bytes a scan of the checkpoint reads (its .metadata; the .distcp files are listed, never opened)."""
    from guard.inventory import discover_models, load_local_model

    return sum(scan.bytes_read for model in discover_models([ckpt]) for scan in load_local_model(model).files)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--write-checkpoint", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--same-bits", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_checkpoint:
        write_checkpoint()
        return 0
    if args.same_bits:
        ours, reference = args.same_bits
        return 0 if _same_bits(ours, reference) else 1
    ckpt, config, parameters = checkpoint()
    size = sum(p.stat().st_size for p in ckpt.iterdir())
    ours_runs, theirs_runs = [], []
    with tempfile.TemporaryDirectory(dir=ROOT / "bench" / "out") as tmp:
        for i in range(args.rounds):
            ours, theirs = Path(tmp) / f"ours{i}", Path(tmp) / f"theirs{i}"
            theirs.mkdir()
            ours_runs.append(run_child([sys.executable, "-m", "guard", "convert", str(ckpt), "--to", "torch",
                                        "--out", str(ours), "--config", str(config)]))
            theirs_runs.append(run_child([sys.executable, "-c", REFERENCE, str(ckpt), str(theirs / "ref.pt")]))
            if i == 0:
                assert_same_bits(ours / "model.safetensors", theirs / "ref.pt")
                largest = largest_tensor(ours)
            shutil.rmtree(ours)
            shutil.rmtree(theirs)
    (t_ours, m_ours), (t_theirs, m_theirs) = median_run(ours_runs), median_run(theirs_runs)
    scanned = scan_bytes(ckpt)  # after the children: the parent's pages would count in their peak RSS
    figures = {"scan_bytes": scanned, "parameters": parameters, "checkpoint_bytes": size, "largest_tensor": largest,
               "rounds": args.rounds,
               "ours": [t_ours, m_ours], "dcp_to_torch_save": [t_theirs, m_theirs],
               "time_ratio": t_ours / t_theirs, "memory_ratio": m_ours / m_theirs,
               "memory_bound": 2 * largest + 300 * 2**20}
    print(f"DCP fp32 + AdamW, {parameters:,} parameters, {size / 1e9:.2f} GB of .distcp "
          f"(largest tensor {largest / 2**20:.0f} MiB), median of {args.rounds}:")
    print(f"  ckpt-guard convert  {t_ours:6.2f} s  {m_ours / 2**20:7.0f} MiB")
    print(f"  dcp_to_torch_save   {t_theirs:6.2f} s  {m_theirs / 2**20:7.0f} MiB")
    print(f"  scan reads {scanned:,} of {size:,} bytes ({scanned / size:.4%})")
    print(f"  ratio               {figures['time_ratio']:6.2f}x   {figures['memory_ratio']:6.2f}x   "
          f"(bound 2x largest + 300 MB = {figures['memory_bound'] / 2**20:.0f} MiB)")
    if args.write_docs:
        write_docs(figures)
    return 0


def write_docs(f: dict) -> None:  # type: ignore[type-arg]
    """Replace (or add) the `## Consolidating DCP checkpoints` section of docs/benchmarks.md."""
    title = "## Consolidating DCP checkpoints"
    section = "\n".join([
        title, "",
        f"`python bench/dcp_consolidate.py --rounds {f['rounds']} --write-docs`: a {f['parameters'] / 1e6:.0f}M-"
        f"parameter Llama (fp32) trained one step with AdamW and saved by `torch.distributed.checkpoint.save` "
        f"(the tutorial's `{{\"model\": ..., \"optim\": ...}}`); {f['checkpoint_bytes'] / 1e9:.2f} GB of `.distcp`, "
        f"largest tensor {f['largest_tensor'] / 2**20:.0f} MiB. Medians of whole processes (os.wait4); the outputs "
        "equal bit for bit.",
        "",
        "| consolidation | wall | peak RSS |", "|---|---|---|",
        f"| `ckpt-guard convert CKPT --to torch --config CFG` | {f['ours'][0]:.2f} s | "
        f"{f['ours'][1] / 2**20:.0f} MiB |",
        f"| `dcp_to_torch_save(CKPT, OUT)` | {f['dcp_to_torch_save'][0]:.2f} s | "
        f"{f['dcp_to_torch_save'][1] / 2**20:.0f} MiB |",
        f"| ratio | {f['time_ratio']:.2f}x | {f['memory_ratio']:.2f}x |", "",
        f"`ckpt-guard scan` of the checkpoint reads {f['scan_bytes']:,} of its {f['checkpoint_bytes']:,} bytes "
        f"({f['scan_bytes'] / f['checkpoint_bytes']:.4%}): the `.metadata` alone.", "",
        "ckpt-guard reads `.metadata` (walked, never unpickled), then each model tensor's chunks from their byte "
        "ranges when the writer asks for it, and never the optimizer's; dcp_to_torch_save loads the whole state "
        "dict, moments included, before it saves. Bound for ours: 2x the largest tensor + 300 MB = "
        f"{f['memory_bound'] / 2**20:.0f} MiB.",
        "",
    ])
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text(encoding="utf-8")
    if title in text:
        start = text.index(title)
        end = text.find("\n## ", start + len(title))
        text = text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
