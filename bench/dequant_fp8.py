"""Benchmark: `convert --dequantize` of a DeepSeek-style FP8 block-scaled model against the reference path.

The model: a Llama (hidden 2048, intermediate 5500, 24 layers, ~1.5 GB) whose linear weights are
stored as DeepSeek-V3 stores them: F8_E4M3 weights and F32 ``weight_scale_inv`` per 128x128 block,
``quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128]}``; intermediate 5500
is not a multiple of 128, so every MLP weight has ragged edge blocks.  Quantized as DeepSeek's
``weight_quant`` does (block amax / 448), written tensor by tensor.

Compared, as whole processes (wall time and peak RSS from os.wait4):

  ckpt-guard:  python -m guard convert DIR --to torch --dequantize --dtype bf16 --out X
  reference:   safetensors.torch.load_file, compressed-tensors' BLOCK-strategy ``dequantize`` on each
               FP8 weight, ``.to(bf16)``, ``save_file``, config without its quantization_config.
               (transformers 4.57's own path, ``FineGrainedFP8Config``, loads FP8 on a GPU only, so on
               this CPU machine the library reference is compressed-tensors' dequantization, the same
               one tests/test_dequantize_formats.py checks the output against.)

Target (issue 22): <= 0.5x the reference's time and <= 0.25x its memory.

    python bench/dequant_fp8.py [--rounds 2] [--layers 24]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5500, num_attention_heads=16,
              num_key_value_heads=16, max_position_embeddings=2048, tie_word_embeddings=False,
              torch_dtype="bfloat16")
BLOCK = 128
REFERENCE = """
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.lifecycle.forward import dequantize
src, out = Path(sys.argv[1]), Path(sys.argv[2])
args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="block", block_structure=[128, 128])
state = load_file(str(src / "model.safetensors"))
result = {}
for name, value in state.items():
    if name.endswith(".weight_scale_inv"):
        continue
    scale = state.get(name + "_scale_inv")
    result[name] = (dequantize(x_q=value, scale=scale, args=args, dtype=torch.bfloat16).contiguous()
                    if scale is not None else value)
out.mkdir(parents=True, exist_ok=True)
save_file(result, str(out / "model.safetensors"), metadata={"format": "pt"})
config = json.loads((src / "config.json").read_text())
config.pop("quantization_config", None)
(out / "config.json").write_text(json.dumps(config))
"""


def make_model(directory: Path, layers: int) -> int:
    """DeepSeek's weight_quant per 128x128 block, written one tensor at a time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from guard.write.framing import safetensors_header

    config = LlamaConfig(**CONFIG, num_hidden_layers=layers, architectures=["LlamaForCausalLM"])
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    entries: list[tuple[str, str, tuple[int, ...]]] = []
    for name, shape in shapes.items():
        if name.endswith("_proj.weight"):
            entries.append((name, "F8_E4M3", shape))
            entries.append((name + "_scale_inv", "F32", (-(-shape[0] // BLOCK), -(-shape[1] // BLOCK))))
        else:
            entries.append((name, "BF16", shape))
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    pending: dict[str, torch.Tensor] = {}
    with open(directory / "model.safetensors", "wb") as fh:
        fh.write(safetensors_header(entries, {"format": "pt"}))
        for name, code, shape in entries:
            if name in pending:
                tensor = pending.pop(name)
            elif code == "F8_E4M3":
                weight = torch.randn(shape, generator=gen) * 0.02
                tensor, pending[name + "_scale_inv"] = _weight_quant(weight)
            else:
                tensor = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            fh.write(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    record = config.to_dict()
    record["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [BLOCK, BLOCK]}
    (directory / "config.json").write_text(json.dumps(record))
    return (directory / "model.safetensors").stat().st_size


def _weight_quant(weight):  # type: ignore[no-untyped-def]
    import torch

    rows, cols = weight.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    padded = torch.nn.functional.pad(weight, (0, bc * BLOCK - cols, 0, br * BLOCK - rows))
    blocks = padded.reshape(br, BLOCK, bc, BLOCK)
    scale_inv = blocks.abs().amax((1, 3)).clamp(min=1e-12) / 448
    quantized = (blocks / scale_inv[:, None, :, None]).reshape(padded.shape)[:rows, :cols]
    return quantized.to(torch.float8_e4m3fn), scale_inv.float()


def make_fp8_block(work: Path, layers: int = 24) -> Path:
    """bench/dequant.py's "fp8-block" case: the DeepSeek-layout model, written once (untimed)."""
    src = work / f"fp8-block-{layers}l"
    if not (src / "config.json").exists():
        print(f"writing {src} ...", flush=True)
        shutil.rmtree(src, ignore_errors=True)
        make_model(src, layers)
    return src


def bench_fp8_block(rounds: int = 2, layers: int = 24) -> dict:  # type: ignore[type-arg]
    """The FP8 case's figures: median wall time and peak RSS of each path, the model and largest-output sizes."""
    from convert import evict, load_average, median_run, run_child

    src = make_fp8_block(ROOT / "bench" / "out" / "dequant", layers)
    work = ROOT / "bench" / "out" / "dequant" / "work-fp8"
    commands = {
        "ckpt-guard convert --dequantize": [sys.executable, "-m", "guard", "convert", str(src), "--to", "torch",
                                            "--dequantize", "--dtype", "bf16", "--out"],
        "reference (load_file + compressed-tensors + save_file)": [sys.executable, "-c", REFERENCE, str(src)],
    }
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, argv in commands.items():
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            runs[name].append(run_child([*argv, str(out)]))
            evict(work)
    with open(src / "model.safetensors", "rb") as fh:
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    largest_out = max(2 * _numel(v["shape"]) for k, v in header.items() if k != "__metadata__")
    figures = {name: median_run(r) for name, r in runs.items()}
    return {"model_bytes": (src / "model.safetensors").stat().st_size, "largest_output_bytes": largest_out,
            "rounds": rounds, "load": load_average(), "runs": figures}


def _numel(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def markdown(result: dict) -> str:  # type: ignore[type-arg]
    ours, ref = result["runs"].values()
    lines = [
        f"FP8 block-scaled (DeepSeek layout, 128x128 `weight_scale_inv`, ragged edges), "
        f"{result['model_bytes'] / 1e9:.2f} GB, to bf16; median of {result['rounds']} (load {result['load']}):",
        "",
        "| path | wall | peak RSS |",
        "|---|---|---|",
    ]
    for name, (wall, rss) in result["runs"].items():
        lines.append(f"| {name} | {wall:.1f} s | {rss / 2**20:,.0f} MiB |")
    lines.append(f"| ratio (ours / reference) | {ours[0] / ref[0]:.2f}x | {ours[1] / ref[1]:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args()
    result = bench_fp8_block(args.rounds, args.layers)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
