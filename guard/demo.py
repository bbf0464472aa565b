"""`make demo`: build sample checkpoints with the real libraries, then scan them.

Run as ``python -m guard.demo [DIR] [--flax-python PATH]`` (default ``demo-models``).  Needs the
``parity`` extra (torch, transformers) and diffusers; the scan itself needs none of it.  Parity's Flax side
runs on transformers 4 wherever ``convert --parity`` finds it (``--flax-python``, passed on to it, names one).
Every step must end as the demo says it does: the first that does not stops the demo with exit 1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

MARKER = ".ckpt-guard-demo"  # a folder this demo made, and may therefore remove and rebuild
# what it makes at the top of its folder (a folder of these names only, from before the marker, is its own)
MADE = frozenset({MARKER, "bart-fp16-decoder", "clean-bert-fp32", "converted", "layouts", "lfs-pointer-checkout",
                  "mistral-bf16-config-fp32", "report.json"})


# what the samples are built to show: (code, the sample it is found in)
EXPECTED_FINDINGS = frozenset({
    ("CG002", "lfs-pointer-checkout"),  # an LFS pointer where the weights should be
    ("CG102", "bart-fp16-decoder"),  # an fp16 decoder beside an fp32 encoder
    ("CG103", "mistral-bf16-config-fp32"),  # bf16 weights, a config that says float32
    ("CG107", "layouts"),  # bart-large's fp16 PyTorch copy and fp32 Flax copy
})


def fresh_root(root: Path) -> str | None:
    """Empty ``root`` for a new build; a reason to stop when it holds anything this demo did not make.

    A rebuild starts from nothing: transformers' ``from_pretrained(from_pt=True)`` picks up a
    flax_model.msgpack left by the last run before the new pytorch_model.bin.
    """
    if root.exists():
        if not root.is_dir() or not {p.name for p in root.iterdir()} <= MADE:
            return f"{root} exists and was not made by this demo; choose another folder"
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / MARKER).write_text("made by `python -m guard.demo`; removed and rebuilt by the next run\n")
    return None


def build_samples(root: Path) -> list[Path]:
    import torch
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        BertConfig,
        BertModel,
        MistralConfig,
        MistralForCausalLM,
    )

    from guard.samples import save_torch_bin

    torch.manual_seed(0)
    root.mkdir(parents=True, exist_ok=True)
    made = []

    clean = root / "clean-bert-fp32"
    BertModel(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(clean)
    made.append(clean)

    # The seed case: a BART whose decoder was saved in half precision next to an fp32 encoder,
    # as a torch zip .bin (Flax keeps the fp16 decoder and optax breaks on the mix).
    bart = root / "bart-fp16-decoder"
    model = BartForConditionalGeneration(BartConfig(
        vocab_size=128, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64))
    model.model.decoder.half()
    save_torch_bin(model, bart)  # transformers 5 writes safetensors only
    made.append(bart)

    # A bf16 Mistral whose config.json still says float32.
    mistral = root / "mistral-bf16-config-fp32"
    MistralForCausalLM(MistralConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64)).to(torch.bfloat16).save_pretrained(mistral)  # type: ignore[arg-type]  # transformers' decorated .to() takes a dtype
    config = json.loads((mistral / "config.json").read_text())
    config.pop("dtype", None)
    config["torch_dtype"] = "float32"
    (mistral / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    made.append(mistral)

    # What CI sees when actions/checkout ran without `lfs: true`.
    pointer = root / "lfs-pointer-checkout"
    pointer.mkdir(exist_ok=True)
    (pointer / "model.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
        "size 437955512\n"
    )
    made.append(pointer)

    # The layouts people publish: a diffusers pipeline saved with save_pretrained() and again with
    # variant="fp16" (every Stable Diffusion repository), and bart-large's two copies that disagree.
    from guard.samples import bart_like_copies, diffusers_pipeline

    layouts = root / "layouts"
    diffusers_pipeline(layouts / "sd-pipeline-with-fp16-variant")
    made.append(layouts / "sd-pipeline-with-fp16-variant")
    bart_like_copies(layouts / "bart-fp16-pytorch-fp32-flax")
    made.append(layouts / "bart-fp16-pytorch-fp32-flax")
    return made


class StepFailed(Exception):
    """A step of the demo did not end as it must: the demo stops there and fails."""


def run_step(cli: list[str], args: list[str], *, expect: int) -> None:
    """``ckpt-guard ARGS``, which must exit ``expect``: 1 where the samples hold what the scan exists to catch,
    0 where they are clean; 2 (the tool could not do what was asked) is never expected."""
    code = subprocess.run([*cli, *args], check=False).returncode
    if code != expect:
        raise StepFailed(f"`ckpt-guard {' '.join(args)}` exited {code}, not {expect}")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    flax_python: list[str] = []
    if "--flax-python" in args:  # parity's Flax side: a transformers-4 environment (convert finds one otherwise)
        at = args.index("--flax-python")
        flax_python = args[at:at + 2]
        del args[at:at + 2]
    root = Path(args[0] if args else "demo-models")
    problem = fresh_root(root)
    if problem:
        print(f"ckpt-guard demo: {problem}", file=sys.stderr)
        return 2
    print(f"== building sample checkpoints in {root}/ with torch, transformers and diffusers")
    from guard.quiet import quiet_libraries

    with quiet_libraries(verbose=False):  # the libraries' advice about their own future is not the demo
        made = build_samples(root)
    for path in made:
        print(f"   {path}")
    try:
        run_steps(root, [sys.executable, "-m", "guard"], flax_python)
    except StepFailed as exc:
        print(f"\nckpt-guard demo: a step failed: {exc}", file=sys.stderr)
        return 1
    print("\n== the demo ran every step as it should")
    return 0


def run_steps(root: Path, cli: list[str], flax_python: list[str]) -> None:
    print(f"\n== ckpt-guard scan {root}: the LFS pointer, the fp16 decoder and the bf16 weights under an fp32 config")
    run_step(cli, ["scan", str(root), "--no-summary"], expect=1)
    layouts = root / "layouts"
    print("\n== a diffusers pipeline with its fp16 variant: one table per component, a row per weight set;"
          " clean")
    run_step(cli, ["scan", str(layouts / "sd-pipeline-with-fp16-variant"), "--no-summary"], expect=0)
    print("\n== bart-large's case: fp16 PyTorch weights beside an fp32 Flax copy are CG107 (two copies disagree),"
          " not a mix")
    run_step(cli, ["scan", str(layouts / "bart-fp16-pytorch-fp32-flax"), "--expect", "uniform", "--no-summary"],
             expect=1)
    report = root / "report.json"
    run_step(cli, ["scan", str(root), "--format", "json", "-o", str(report), "--no-summary"], expect=1)
    print(f"\n== the same findings as JSON for machines: {report}")
    findings = json.loads(report.read_text())["findings"]
    found = {(f["code"], Path(f["path"]).relative_to(root).parts[0]) for f in findings}
    missed = sorted(EXPECTED_FINDINGS - found)
    if missed:
        raise StepFailed(f"{report} lacks the findings the samples were built to show: {missed}")
    print(f"   (render it again with: ckpt-guard report {report} --format markdown)")

    mistral = root / "mistral-bf16-config-fp32"
    print("\n== the fix: the bf16 Mistral's config.json said float32 (CG103); under a bf16 policy, `fix --write`"
          " rewrites that one value, verifies and scans again")
    run_step(cli, ["fix", str(mistral), "--expect", "bf16", "--write"], expect=0)

    converted = root / "converted"
    converted.mkdir(exist_ok=True)
    print("\n== the bf16 Mistral to Flax, bit-exact (no fp32 bridge), with the parity smoke test"
          " (PyTorch on this transformers, Flax on transformers 4 in its own environment)")
    run_step(cli, ["convert", str(mistral), "--to", "flax",
                   "--out", str(converted / "mistral-flax"), "--parity", *flax_python], expect=0)
    print("\n== the BART with the fp16 decoder to uniform fp32 Flax, with the parity smoke test")
    run_step(cli, ["convert", str(root / "bart-fp16-decoder"), "--to", "flax", "--dtype", "fp32",
                   "--out", str(converted / "bart-flax-fp32"), "--parity", *flax_python], expect=0)
    print(f"\n== scanning the converted models: {converted}")
    run_step(cli, ["scan", str(converted), "--expect", "uniform", "--no-summary"], expect=0)


if __name__ == "__main__":
    raise SystemExit(main())
