"""Parity streamed block by block: an error in the LAST layer is CG302 naming that block, and the
peak memory of a parity run does not grow with the number of layers.

Checkpoints are saved by transformers and converted by ckpt-guard; the errors are planted in the
msgpack ckpt-guard wrote, in the last of four layers: a transposed square kernel, a kernel scaled
by 1.01, and one whole kernel one bf16 ulp up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
import transformers  # noqa: E402
from test_convert import convert  # noqa: E402
from test_parity_planted import planted  # noqa: E402

from guard.parity.run import run_parity  # noqa: E402

# streamed, block-located verdicts: both sides in this process, which needs transformers 4's Flax classes
pytestmark = [pytest.mark.slow, pytest.mark.transformers4]
ROOT = Path(__file__).resolve().parents[1]
LAST = 3  # four layers
TINY = {"vocab_size": 99, "max_position_embeddings": 64}
CONFIGS: dict[str, Callable[[], Any]] = {
    "bert": lambda: transformers.BertConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                            intermediate_size=37, architectures=["BertForMaskedLM"], **TINY),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=4, n_head=4, n_positions=64,
                                            architectures=["GPT2LMHeadModel"]),
    "llama": lambda: transformers.LlamaConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                              num_key_value_heads=2, intermediate_size=64,
                                              architectures=["LlamaForCausalLM"], **TINY),
}
# per architecture: (the planted kernel, the block the finding must name)
SQUARE = {"bert": ("bert/encoder/layer/3/attention/self/query/kernel", "bert.encoder.layer.3.attention"),
          "gpt2": ("transformer/h/3/attn/c_proj/kernel", "transformer.h.3.attn"),
          "llama": ("model/layers/3/self_attn/q_proj/kernel", "model.layers.3.self_attn")}
MLP_OUT = {"bert": ("bert/encoder/layer/3/output/dense/kernel", "bert.encoder.layer.3.output"),
           "gpt2": ("transformer/h/3/mlp/c_proj/kernel", "transformer.h.3.mlp"),
           "llama": ("model/layers/3/mlp/down_proj/kernel", "model.layers.3.mlp")}
DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def transposed(flat: dict[tuple[str, ...], Any], arch: str) -> None:
    key = tuple(SQUARE[arch][0].split("/"))
    flat[key] = flat[key].T.copy()


def scaled(flat: dict[tuple[str, ...], Any], arch: str) -> None:
    import numpy as np

    key = tuple(MLP_OUT[arch][0].split("/"))
    flat[key] = (flat[key].astype(np.float32) * 1.01).astype(flat[key].dtype)


def ulp(flat: dict[tuple[str, ...], Any], arch: str) -> None:
    """Every element of the kernel one bf16 ulp up (in fp32 weights: 2^16 fp32 ulps, the same step)."""
    import numpy as np

    key = tuple(MLP_OUT[arch][0].split("/"))
    a = flat[key]
    bits = a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)
    flat[key] = (bits + (1 if a.dtype.itemsize == 2 else 1 << 16)).astype(bits.dtype).view(a.dtype)


PLANTS = {"transposed-kernel": (transposed, SQUARE), "scaled-x1.01": (scaled, MLP_OUT),
          "one-bf16-ulp": (ulp, MLP_OUT)}


def save(root: Path, config: Any, *, dtype: Any = None) -> Path:
    torch.manual_seed(0)
    model = getattr(transformers, config.architectures[0])(config)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(root / "src")
    return root / "src"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple[Path, Path]]:
    cache: dict[tuple[str, str], tuple[Path, Path]] = {}

    def get(arch: str, dtype: str) -> tuple[Path, Path]:
        if (arch, dtype) not in cache:
            root = tmp_path_factory.mktemp(f"{arch}-{dtype}")
            src = save(root, CONFIGS[arch](), dtype=DTYPES[dtype])
            assert convert(src, "--to", "flax", "--out", root / "flax") == 0
            cache[arch, dtype] = src, root / "flax"
        return cache[arch, dtype]

    return get


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_a_correct_conversion_streams_every_block_and_passes(converted: Any, arch: str, dtype: str) -> None:
    findings, figures = run_parity(*converted(arch, dtype))
    assert findings == [], [f.message for f in findings]
    assert figures["streamed"] is True and figures["blocks"] == 4, figures.get("not_streamed")
    for comp in (c for c in figures["comparisons"] if c["judged"]):
        located = comp["located"]
        assert located["blocks_compared"] == 4 and located["failing_blocks"] == 0 and located["first"] is None
        assert all(b["max_rel"] <= b["bound"] for b in located["per_block"])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", list(CONFIGS))
@pytest.mark.parametrize("kind", list(PLANTS))
def test_an_error_in_the_last_layer_is_cg302_naming_its_block(converted: Any, tmp_path: Path, kind: str,
                                                               arch: str, dtype: str) -> None:
    plant, table = PLANTS[kind]
    src, flax_dir = converted(arch, dtype)
    findings, figures = run_parity(src, planted(flax_dir, tmp_path / "bad", plant, arch))
    assert findings and {f.code for f in findings} == {"CG302"}, [f.message for f in findings]
    assert figures["streamed"] is True, figures.get("not_streamed")
    fp32 = figures["comparisons"][0]
    assert fp32["name"] == "fp32" and not fp32["passed"]
    block = table[arch][1]
    assert fp32["located"]["first"]["module"] == block, fp32["located"]
    first = fp32["located"]["first"]
    assert first["max_rel"] > first["bound"] == fp32["tolerance"]["max_rel"]
    # the layers before it agree: the error is located, not smeared over the stack
    per_block = {b["block"]: b for b in fp32["located"]["per_block"]}
    assert all(per_block[block.rsplit(".", 1)[0].replace(f".{LAST}", f".{i}")]["max_rel"] <= 1e-5
               for i in range(LAST))
    message = next(f.message for f in findings if f.message.startswith("fp32 "))
    assert f"first block that disagrees: '{block}' (max_rel {first['max_rel']:.3g} against 1e-05)" in message


LAYERS_SMALL, LAYERS_DEEP = 2, 14
WIDE = dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=8,
            vocab_size=256, max_position_embeddings=128, architectures=["LlamaForCausalLM"])


# The child's own high-water mark (VmHWM), read as it exits: rusage's ru_maxrss survives fork and
# exec, so it would start at this pytest process's size, which grows with each model built here.
LAUNCH = """import runpy, sys
PEAK, sys.argv = sys.argv[1], ["guard", *sys.argv[2:]]
try:
    runpy.run_module("guard", run_name="__main__")
finally:
    with open(PEAK, "w") as fh:
        fh.write(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
"""


def peak_rss(torch_dir: Path, flax_dir: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """Peak RSS (bytes) of `ckpt-guard parity` in a fresh process, and its JSON report."""
    report, peak = tmp_path / f"{torch_dir.parent.name}.json", tmp_path / f"{torch_dir.parent.name}.peak"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", LAUNCH, str(peak), "parity", str(torch_dir), str(flax_dir),
                           "-f", "json", "-o", str(report)], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return int(peak.read_text()) * 1024, json.loads(report.read_text())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from Linux's /proc")
def test_peak_memory_does_not_grow_with_depth(tmp_path: Path) -> None:
    """14 layers against 2: 12 more layers are 163 MB in fp32 (41M parameters); a run that held
    every layer would grow by that at least once (the whole-model path held four copies).
    The bound is half of one copy: generous for allocator noise, far below any whole-model run."""
    peaks = {}
    for layers in (LAYERS_SMALL, LAYERS_DEEP):
        root = tmp_path / f"l{layers}"
        src = save(root, transformers.LlamaConfig(num_hidden_layers=layers, **WIDE), dtype=torch.bfloat16)
        assert convert(src, "--to", "flax", "--out", root / "flax") == 0
        peaks[layers], report = peak_rss(src, root / "flax", tmp_path)
        parity = report["extra"]["parity"]
        assert parity["passed"] is True and parity["streamed"] is True and parity["blocks"] == layers
    per_layer_fp32 = 4 * (4 * 512 * 512 + 3 * 512 * 1536 + 2 * 512)
    added = (LAYERS_DEEP - LAYERS_SMALL) * per_layer_fp32
    assert peaks[LAYERS_DEEP] - peaks[LAYERS_SMALL] < added / 2, (peaks, added)
