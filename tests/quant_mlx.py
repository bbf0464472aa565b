"""MLX checkpoints written by mlx-lm itself (``mlx_lm.convert --quantize``), from its own venv.

mlx-lm 0.32 wants transformers 5 while the main venv pins 4.57, so it lives in ``.venv-mlx``
(gitignored; ``make mlx-venv`` builds it, and so does ``mlx_python()`` when it is missing, from
guard/envs/mlx.txt). The source is the tiny Llama of ``quant_writers`` saved by our transformers,
with a word-level tokenizer (convert copies one).

Observed (mlx-lm 0.32.2, mlx 0.32.4, 4-bit affine, group 64): ``weight`` U32 [out, in/8], ``scales``
and ``biases`` BF16 [out, in/64] for every Linear *and* ``model.embed_tokens`` and ``lm_head``;
norms BF16. mxfp4 mode: ``scales`` U8 [out, in/32], no biases. config.json has ``quantization``
and the same record as ``quantization_config`` ({"group_size": 64, "bits": 4, "mode": "affine"}),
no quant_method; ``model.safetensors.index.json`` for the single shard; mlx-lm prints 4.520 bits
per weight (8.513 for 8-bit, 4.271 for mxfp4). nvfp4 (group 16): ``scales`` U8 [out, in/16], 4.520;
mxfp8 (group 32): ``weight`` U32 [out, in/4], ``scales`` U8 [out, in/32], 8.264.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MLX_VENV = Path(os.environ.get("CKPT_GUARD_MLX_VENV", ROOT / ".venv-mlx"))
CONSTRAINTS = ROOT / "guard" / "envs" / "mlx.txt"


# out folder -> the bits per weight mlx_lm.convert printed ("Quantized model with 4.520 bits per weight.")
REPORTED_BITS_PER_WEIGHT: dict[Path, float] = {}


class MlxUnavailable(RuntimeError):
    """mlx-lm could not be installed here (no registry access): the test that needs it skips."""


def mlx_python() -> Path:
    """The venv's python, built first when missing or older than guard/envs/mlx.txt."""
    python, stamp = MLX_VENV / "bin" / "python", MLX_VENV / ".installed"
    if stamp.exists() and stamp.stat().st_mtime >= CONSTRAINTS.stat().st_mtime:
        return python
    steps = ([sys.executable, "-m", "venv", str(MLX_VENV)],
             [str(python), "-m", "pip", "install", "-q", "-c", str(CONSTRAINTS), "mlx[cpu]", "mlx-lm"])
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise MlxUnavailable(f"could not build {MLX_VENV}: {' '.join(step[:4])}: "
                                 f"{' '.join(proc.stderr.split()[-40:])}")
    stamp.touch()
    return python


def save_with_tokenizer(model: object, folder: Path) -> Path:
    """save_pretrained plus a 256-word tokenizer (mlx_lm.convert loads one and copies it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(folder)  # type: ignore[attr-defined]
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(256)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(folder)
    return folder


def write_mlx(out: Path, *, bits: int = 4, group_size: int = 64, mode: str = "affine") -> Path:
    """``mlx_lm.convert -q`` of the tiny Llama: ``mode`` affine (bits 2-8), mxfp4 (group 32), nvfp4, mxfp8."""
    from quant_writers import tiny_llama

    python = mlx_python()
    if out.exists() and not any(out.iterdir()):
        out.rmdir()  # convert refuses an existing folder
    with tempfile.TemporaryDirectory() as base:
        save_with_tokenizer(tiny_llama(), Path(base))
        proc = subprocess.run([str(python), "-m", "mlx_lm", "convert", "--hf-path", base, "--mlx-path", str(out),
                               "-q", "--q-bits", str(bits), "--q-group-size", str(group_size), "--q-mode", mode],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode != 0:
        raise RuntimeError(f"mlx_lm.convert failed: {proc.stderr[-2000:]}")
    printed = re.search(r"with ([0-9.]+) bits per weight", proc.stdout + proc.stderr)
    if printed:
        REPORTED_BITS_PER_WEIGHT[out] = float(printed.group(1))
    return out
