"""The dequantizers (compressed-tensors, the FP8 family, MXFP4, MLX, torchao), each against its library.

The quantized tensors come from the libraries' own compressors where one runs on CPU
(compressed-tensors' ``compress``, torchao's ``quantize_``); the layouts with no CPU writer are written
to the spec and checked against a reader someone else wrote (compressed-tensors' BLOCK strategy for
DeepSeek-style FP8, transformers' ``Mxfp4Config(dequantize=True)`` for gpt-oss, ``mlx.core.dequantize``).
"Equal" means within one rounding step of the reference's dtype (``assert_within_one_step``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

from guard.convert.read.dequant import DEQUANTIZERS, DequantError, dequantizer  # noqa: E402

_VIEWS = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
          torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
          torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2)}


def to_numpy(tensor: Any) -> Any:
    """A torch tensor as numpy in its own dtype (ml_dtypes for bf16 and fp8), as the pipeline's ``read`` gives it."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype in _VIEWS:
        int_type, ml_type = _VIEWS[tensor.dtype]
        return tensor.view(int_type).numpy().view(ml_type)
    return tensor.numpy()


def assert_within_one_step(mine: Any, reference: Any) -> None:
    """``mine`` (float32) rounded once to the reference's dtype is at most one step (ulp) from it."""
    ref = reference.detach().cpu()
    ours = torch.from_numpy(np.ascontiguousarray(mine)).to(ref.dtype)
    assert tuple(ours.shape) == tuple(ref.shape)
    if ref.dtype == torch.float32:
        bits_ours, bits_ref = ours.view(torch.int32).long(), ref.view(torch.int32).long()
    else:
        bits_ours, bits_ref = ours.view(torch.int16).long(), ref.view(torch.int16).long()
    same_sign = torch.signbit(ours) == torch.signbit(ref)
    zeros = (ours == 0) & (ref == 0)
    assert bool(((same_sign & ((bits_ours - bits_ref).abs() <= 1)) | zeros).all()), (
        f"max difference {float((ours.float() - ref.float()).abs().max())}")


def module(prefix: str, store: dict[str, Any], payload: str, **extra: Any) -> Any:
    """A QuantModule-shaped record over a dict of stored tensors."""
    components = {name.rsplit(".", 1)[-1]: name for name in store if name != payload}
    return SimpleNamespace(prefix=prefix, payload=payload, weight=extra.pop("weight", f"{prefix}.weight"),
                           components=components, logical_shape=extra.pop("logical_shape", None),
                           bits=None, group_size=None, format=extra.pop("format", None), method="", **extra)


def quant(**params: Any) -> Any:
    return SimpleNamespace(params=params, bits=params.get("bits"), group_size=params.get("group_size"),
                           format=params.get("format"), method=params.get("method", ""))


def reader(store: dict[str, Any]) -> Any:
    def read(name: str) -> Any:
        if name not in store:
            raise DequantError("CG110", name, "not in the set")
        return store[name]
    return read


def test_the_registry_names_every_format_module() -> None:
    for method in ("compressed-tensors", "fp8", "fbgemm_fp8", "modelopt", "mxfp4", "mlx", "torchao"):
        assert method in DEQUANTIZERS
        assert callable(dequantizer(method).dequantize)


# ---------------------------------------------------------------- compressed-tensors, by its own compressors

def _int_scheme(bits: int, symmetric: bool, strategy: str, group: int | None) -> tuple[Any, dict[str, Any]]:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    torch.manual_seed(bits * 10 + symmetric)
    weight = torch.randn(96, 256, dtype=torch.bfloat16)
    grouped = weight.float().reshape(96, -1, group) if strategy == "group" else weight.float().reshape(96, 1, -1)
    if symmetric:
        scale = (grouped.abs().amax(-1) / (2 ** (bits - 1) - 1)).to(torch.bfloat16)
        zero = torch.zeros_like(scale, dtype=torch.int8)
    else:
        low, high = grouped.amin(-1), grouped.amax(-1)
        scale = ((high - low) / (2**bits - 1)).to(torch.bfloat16)
        zero = (-(2 ** (bits - 1)) - torch.round(low / scale.float())).clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        zero = zero.to(torch.int8)
    args = QuantizationArgs(num_bits=bits, symmetric=symmetric, strategy=strategy, group_size=group)
    return QuantizationScheme(targets=["Linear"], weights=args), {"weight": weight, "weight_scale": scale,
                                                                  "weight_zero_point": zero}


def _ct_roundtrip(compressor: Any, scheme: Any, state: dict[str, Any], q: Any = None) -> None:
    from guard.convert.read.dequant import compressed_tensors as ct

    compressed = compressor.compress(state, scheme)
    reference = compressor.decompress(compressed, scheme)["weight"]
    store = {f"m.{key}": to_numpy(value) for key, value in compressed.items() if isinstance(value, torch.Tensor)}
    payload = "m.weight_packed" if "m.weight_packed" in store else "m.weight"
    mod = module("m", store, payload)
    out = ct.dequantize(mod, q or quant(), reader(store))
    assert list(out) == ["m.weight"]
    assert out["m.weight"].dtype == np.float32
    assert_within_one_step(out["m.weight"], reference)
    assert ct.outputs(mod, q or quant(), reader(store)) == {"m.weight": tuple(reference.shape)}


@pytest.mark.parametrize("bits,symmetric,strategy,group", [
    (4, True, "group", 64), (4, False, "group", 64), (8, True, "channel", None), (8, False, "channel", None),
    (3, True, "group", 32), (2, False, "group", 128),
])
def test_pack_quantized_equals_the_compressors_decompress(bits: int, symmetric: bool, strategy: str,
                                                          group: int | None) -> None:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    scheme, state = _int_scheme(bits, symmetric, strategy, group)
    _ct_roundtrip(PackedQuantizationCompressor, scheme, state)


@pytest.mark.parametrize("symmetric", [True, False])
def test_int_and_naive_quantized_equal_the_compressors_decompress(symmetric: bool) -> None:
    from compressed_tensors.compressors.naive_quantized.base import (
        IntQuantizationCompressor,
        NaiveQuantizationCompressor,
    )

    scheme, state = _int_scheme(8, symmetric, "channel", None)
    _ct_roundtrip(NaiveQuantizationCompressor, scheme, state)
    _ct_roundtrip(IntQuantizationCompressor, scheme, state)


def test_float_quantized_fp8_per_channel_equals_the_compressors_decompress() -> None:
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    torch.manual_seed(1)
    weight = torch.randn(96, 256, dtype=torch.bfloat16)
    scale = (weight.float().abs().amax(1, keepdim=True) / 448).to(torch.bfloat16)
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="channel")
    _ct_roundtrip(FloatQuantizationCompressor, QuantizationScheme(targets=["Linear"], weights=args),
                  {"weight": weight, "weight_scale": scale})


def test_float_quantized_fp8_blocks_with_ragged_edges_equal_the_compressors_decompress() -> None:
    """A 200x300 weight in 128x128 blocks: the last row and column of blocks are cut (DeepSeek's ragged edges)."""
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    torch.manual_seed(2)
    weight = torch.randn(200, 300, dtype=torch.bfloat16)
    padded = torch.nn.functional.pad(weight.float(), (0, 84, 0, 56))
    scale = padded.reshape(2, 128, 3, 128).abs().amax((1, 3)) / 448
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="block", block_structure=[128, 128])
    q = quant(config_groups={"group_0": {"weights": {"block_structure": [128, 128]}}})
    _ct_roundtrip(FloatQuantizationCompressor, QuantizationScheme(targets=["Linear"], weights=args),
                  {"weight": weight, "weight_scale": scale}, q)


def test_nvfp4_pack_quantized_equals_the_compressors_decompress() -> None:
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    torch.manual_seed(3)
    weight = torch.randn(96, 256, dtype=torch.bfloat16)
    global_scale = (448 * 6 / weight.float().abs().max()).reshape(1)
    local = weight.float().reshape(96, -1, 16).abs().amax(-1) / 6
    scale = (local * global_scale).to(torch.float8_e4m3fn).float()
    args = QuantizationArgs(num_bits=4, type="float", symmetric=True, strategy="tensor_group", group_size=16)
    _ct_roundtrip(NVFP4PackedCompressor, QuantizationScheme(targets=["Linear"], weights=args),
                  {"weight": weight, "weight_scale": scale, "weight_global_scale": global_scale})


@pytest.mark.parametrize("bits", [4, 8])
def test_mx_formats_equal_the_compressors_decompress(bits: int) -> None:
    """mxfp4-pack-quantized and mxfp8-quantized: E8M0 scale bytes per 32 columns."""
    import torch as t
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    t.manual_seed(bits)
    weight = t.randn(64, 256, dtype=t.bfloat16)
    amax = weight.float().reshape(64, -1, 32).abs().amax(-1)
    scale = t.exp2(t.ceil(t.log2(amax / (6.0 if bits == 4 else 448.0))))
    args = QuantizationArgs(num_bits=bits, type="float", symmetric=True, strategy="group", group_size=32,
                            scale_dtype=t.uint8)
    fmt = "mxfp4-pack-quantized" if bits == 4 else "mxfp8-quantized"
    _ct_roundtrip(BaseCompressor.get_value_from_registry(fmt), QuantizationScheme(targets=["Linear"], weights=args),
                  {"weight": weight, "weight_scale": scale})


def test_pack_quantized_with_g_idx_reads_each_column_s_group() -> None:
    """Activation ordering (GPTQ ``actorder``): ``weight_g_idx`` maps column j to its scale group.

    compressed-tensors 0.20 no longer writes it, so the codes are packed by its ``pack_to_int32`` and the
    expectation is the definition: ``w[:, j] = q[:, j] * scale[:, g_idx[j]]``.
    """
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    from guard.convert.read.dequant import compressed_tensors as ct

    generator = torch.Generator().manual_seed(4)
    g_idx = (torch.arange(256) // 64)[torch.randperm(256, generator=generator)].to(torch.int32)
    codes = torch.randint(-8, 8, (96, 256), generator=generator, dtype=torch.int8)
    scale = torch.rand(96, 4, generator=generator).to(torch.bfloat16)
    store = {"m.weight_packed": to_numpy(pack_to_int32(codes, 4)), "m.weight_scale": to_numpy(scale),
             "m.weight_shape": np.array([96, 256], dtype=np.int64), "m.weight_g_idx": to_numpy(g_idx)}
    out = ct.dequantize(module("m", store, "m.weight_packed"), quant(), reader(store))["m.weight"]
    expected = codes.float() * scale.float()[:, g_idx.long()]
    assert_within_one_step(out, expected.to(torch.bfloat16))


def test_a_g_idx_naming_a_group_that_does_not_exist_is_a_finding() -> None:
    from guard.convert.read.dequant import compressed_tensors as ct

    store = {"m.weight_packed": np.zeros((4, 8), dtype=np.int32), "m.weight_scale": np.ones((4, 1), np.float32),
             "m.weight_shape": np.array([4, 64], dtype=np.int64), "m.weight_g_idx": np.full(64, 5, dtype=np.int32)}
    store["m.weight_scale"] = np.ones((4, 2), np.float32)
    with pytest.raises(DequantError) as caught:
        ct.dequantize(module("m", store, "m.weight_packed"), quant(), reader(store))
    assert caught.value.code == "CG111"


# ---------------------------------------------------------------- the FP8 family


def _deepseek_fp8(rows: int, cols: int, block: tuple[int, int] = (128, 128), seed: int = 5) -> tuple[Any, Any, Any]:
    """DeepSeek-V3's ``weight_quant``: per-block scale = amax / 448, weight / scale cast to E4M3, scale_inv stored."""
    torch.manual_seed(seed)
    weight = torch.randn(rows, cols, dtype=torch.bfloat16)
    br, bc = -(-rows // block[0]), -(-cols // block[1])
    padded = torch.nn.functional.pad(weight.float(), (0, bc * block[1] - cols, 0, br * block[0] - rows))
    blocks = padded.reshape(br, block[0], bc, block[1])
    scale_inv = blocks.abs().amax((1, 3)).clamp(min=1e-12) / 448
    quantized = (blocks / scale_inv[:, None, :, None]).reshape(padded.shape)[:rows, :cols].to(torch.float8_e4m3fn)
    return weight, quantized, scale_inv


@pytest.mark.parametrize("rows,cols,block", [(256, 384, (128, 128)), (200, 300, (128, 128)), (96, 160, (64, 32))])
def test_fine_grained_fp8_equals_compressed_tensors_block_dequantization(rows: int, cols: int,
                                                                         block: tuple[int, int]) -> None:
    """DeepSeek-V3/R1 and Qwen3-FP8 layout, ragged edges included, against compressed-tensors' BLOCK strategy."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize

    from guard.convert.read.dequant import fp8

    _, quantized, scale_inv = _deepseek_fp8(rows, cols, block)
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="block", block_structure=list(block))
    reference = ct_dequantize(x_q=quantized, scale=scale_inv, args=args, dtype=torch.float32)
    store = {"m.weight": to_numpy(quantized), "m.weight_scale_inv": to_numpy(scale_inv)}
    out = fp8.dequantize(module("m", store, "m.weight"), quant(weight_block_size=list(block)), reader(store))
    assert_within_one_step(out["m.weight"], reference)
    assert_within_one_step(out["m.weight"], reference.to(torch.bfloat16))


def test_fine_grained_fp8_fused_experts_read_each_expert_s_blocks() -> None:
    """Experts stacked in one [E, out, in] weight with [E, out/128, in/128] scales: expert by expert."""
    from guard.convert.read.dequant import fp8

    parts = [_deepseek_fp8(256, 200, seed=s) for s in range(3)]
    quantized = torch.stack([p[1] for p in parts])
    scale_inv = torch.stack([p[2] for p in parts])
    store = {"e.weight": to_numpy(quantized), "e.weight_scale_inv": to_numpy(scale_inv)}
    out = fp8.dequantize(module("e", store, "e.weight"), quant(), reader(store))["e.weight"]
    for index, (_, q, s) in enumerate(parts):
        expected = q.float() * s.repeat_interleave(128, 0)[:256].repeat_interleave(128, 1)[:, :200]
        assert_within_one_step(out[index], expected)


def test_fbgemm_fp8_scales_each_row() -> None:
    from guard.convert.read.dequant import fp8

    torch.manual_seed(6)
    weight = torch.randn(64, 128)
    scale = weight.abs().amax(1, keepdim=True) / 448
    quantized = (weight / scale).to(torch.float8_e4m3fn)
    store = {"m.weight": to_numpy(quantized), "m.weight_scale": to_numpy(scale)}
    out = fp8.dequantize(module("m", store, "m.weight"), quant(), reader(store))["m.weight"]
    assert_within_one_step(out, quantized.float() * scale)


def test_modelopt_fp8_per_tensor_and_nvfp4() -> None:
    """ModelOpt NVFP4: ``fp4 * weight_scale * weight_scale_2``; the FP4 decoding is compressed-tensors' own."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    from guard.convert.read.dequant import fp8

    torch.manual_seed(7)
    quantized = (torch.randn(32, 64) * 50).to(torch.float8_e4m3fn)
    store = {"m.weight": to_numpy(quantized), "m.weight_scale": np.array(0.01, np.float32),
             "m.input_scale": np.array(0.5, np.float32)}
    out = fp8.dequantize(module("m", store, "m.weight"), quant(quant_algo="FP8"), reader(store))["m.weight"]
    assert_within_one_step(out, quantized.float() * torch.tensor(0.01))

    packed = torch.randint(0, 256, (32, 32), dtype=torch.uint8)
    block_scale = (torch.rand(32, 4) * 100).to(torch.float8_e4m3fn)
    second = torch.tensor(0.003)
    store = {"m.weight": to_numpy(packed), "m.weight_scale": to_numpy(block_scale),
             "m.weight_scale_2": second.numpy()}
    out = fp8.dequantize(module("m", store, "m.weight"), quant(quant_algo="NVFP4"), reader(store))["m.weight"]
    values = unpack_fp4_from_uint8(packed, 32, 64, dtype=torch.float32)
    expected = values * block_scale.float().repeat_interleave(16, dim=1) * second
    assert_within_one_step(out, expected)


def test_fp8_weight_without_a_scale_is_a_missing_component() -> None:
    from guard.convert.read.dequant import fp8

    store = {"m.weight": np.zeros((4, 4), ml_dtypes.float8_e4m3fn)}
    with pytest.raises(DequantError) as caught:
        fp8.dequantize(module("m", store, "m.weight"), quant(), reader(store))
    assert caught.value.code == "CG110"


# ---------------------------------------------------------------- MXFP4 (gpt-oss)


def test_mxfp4_equals_transformers_convert_moe_packed_tensors() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from guard.convert.read.dequant import mxfp4

    generator = torch.Generator().manual_seed(8)
    blocks = torch.randint(0, 256, (3, 40, 4, 16), generator=generator, dtype=torch.uint8)
    scales = torch.randint(110, 140, (3, 40, 4), generator=generator, dtype=torch.uint8)
    reference = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    store = {"e.gate_up_proj_blocks": blocks.numpy(), "e.gate_up_proj_scales": scales.numpy()}
    mod = module("e.gate_up_proj", store, "e.gate_up_proj_blocks", weight="e.gate_up_proj")
    out = mxfp4.dequantize(mod, quant(), reader(store))
    assert list(out) == ["e.gate_up_proj"]
    assert_within_one_step(out["e.gate_up_proj"], reference)
    assert mxfp4.outputs(mod, quant(), reader(store)) == {"e.gate_up_proj": (3, 128, 40)}


def set_modules(folder: Path) -> tuple[Any, Any, list[Any], Any]:
    """(quantization, dequantizer module, QuantModules, read) of a written model folder, as convert reads it:
    the inventory's grouping (guard.inventory.quantization) and each tensor's bytes from its file."""
    from guard.convert.read.io_torch import read_range
    from guard.inventory import discover_models, load_local_model
    from guard.inventory.quantization import quantized_modules

    inv = load_local_model(discover_models([folder])[0])
    ws = inv.primary
    found = inv.quantization(ws)
    by_name = {info.name: info for info in ws.tensors}
    modules = list(quantized_modules(inv, ws))
    assert modules and not any(m.missing for m in modules)
    return found, dequantizer(found.method), modules, lambda name: read_range(by_name[name])


def test_gpt_oss_files_equal_transformers_loading_them_dequantized(tmp_path: Path) -> None:
    """gpt-oss MXFP4 experts (written to the spec: no CPU writer) against ``Mxfp4Config(dequantize=True)``."""
    from quant_spec_writers import write_mxfp4
    from transformers import AutoModelForCausalLM, Mxfp4Config

    folder = write_mxfp4(tmp_path / "gpt-oss")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16,
                                                 quantization_config=Mxfp4Config(dequantize=True))
    loaded = dict(model.named_parameters())
    found, deq, modules, read = set_modules(folder)
    assert found.method == "mxfp4"
    for mod in modules:
        out = deq.dequantize(mod, found, read)
        assert list(out) == [mod.weight]
        assert_within_one_step(out[mod.weight], loaded[mod.weight])
    assert len(modules) == 2 * model.config.num_hidden_layers


def test_mxfp4_blocks_and_scales_that_disagree_are_a_shape_finding() -> None:
    from guard.convert.read.dequant import mxfp4

    store = {"e.down_proj_blocks": np.zeros((2, 8, 2, 16), np.uint8),
             "e.down_proj_scales": np.zeros((2, 8, 3), np.uint8)}
    with pytest.raises(DequantError) as caught:
        mxfp4.dequantize(module("e.down_proj", store, "e.down_proj_blocks"), quant(), reader(store))
    assert caught.value.code == "CG111"


# ---------------------------------------------------------------- MLX


_MLX_SCRIPT = """
import sys, numpy as np, mlx.core as mx
out = {}
rng = np.random.default_rng(0)
w = mx.array(rng.standard_normal((48, 256)).astype(np.float32)).astype(mx.bfloat16)
for bits, group in ((4, 64), (8, 64), (3, 32), (6, 64), (2, 128), (5, 32)):
    q, s, b = mx.quantize(w, group_size=group, bits=bits)
    # mlx evaluates in the scales' dtype: in bf16 it rounds the product and then the sum, so where the
    # sum cancels its bf16 output sits several steps from the exact value; its f32 evaluation is exact
    d = mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32), group_size=group, bits=bits)
    key = f"affine_{bits}_{group}"
    out[key + "_q"] = np.array(q); out[key + "_s"] = np.array(s.astype(mx.float32))
    out[key + "_b"] = np.array(b.astype(mx.float32))
    out[key + "_d"] = np.array(d.astype(mx.float32))
for mode, group, bits in (("mxfp4", 32, 4), ("nvfp4", 16, 4), ("mxfp8", 32, 8)):
    try:
        q, s = mx.quantize(w, group_size=group, bits=bits, mode=mode)[:2]
        d = mx.dequantize(q, s, group_size=group, bits=bits, mode=mode)
    except Exception as exc:  # an mlx without this mode
        print("skip", mode, exc, file=sys.stderr); continue
    out[mode + "_q"] = np.array(q); out[mode + "_s"] = np.array(s.view(mx.uint8))
    out[mode + "_d"] = np.array(d.astype(mx.float32))
np.savez(sys.argv[1], **out)
"""


def test_mlx_equals_mlx_core_dequantize(tmp_path: Path) -> None:
    """Affine (2-8 bits, codes straddling words included), mxfp4, nvfp4 and mxfp8, against mlx itself."""
    from quant_mlx import MlxUnavailable, mlx_python

    from guard.convert.read.dequant import mlx

    try:
        python = mlx_python()
    except MlxUnavailable as exc:
        pytest.skip(str(exc))
    subprocess.run([str(python), "-c", _MLX_SCRIPT, str(tmp_path / "mlx.npz")], check=True, timeout=300)
    data = np.load(tmp_path / "mlx.npz")
    checked = 0
    for bits, group in ((4, 64), (8, 64), (3, 32), (6, 64), (2, 128), (5, 32)):
        key = f"affine_{bits}_{group}"
        store = {"m.weight": data[key + "_q"], "m.scales": data[key + "_s"].astype(ml_dtypes.bfloat16),
                 "m.biases": data[key + "_b"].astype(ml_dtypes.bfloat16)}
        q = quant(quantization={"group_size": group, "bits": bits, "mode": "affine"})
        out = mlx.dequantize(module("m", store, "m.weight"), q, reader(store))["m.weight"]
        assert_within_one_step(out, torch.from_numpy(data[key + "_d"]))
        checked += 1
    for mode, group, bits in (("mxfp4", 32, 4), ("nvfp4", 16, 4), ("mxfp8", 32, 8)):
        if mode + "_q" not in data:
            continue
        scales = data[mode + "_s"]
        if mode == "nvfp4":
            scales = scales.view(ml_dtypes.float8_e4m3fn)
        store = {"m.weight": data[mode + "_q"], "m.scales": scales}
        q = quant(quantization={"group_size": group, "bits": bits, "mode": mode})
        out = mlx.dequantize(module("m", store, "m.weight"), q, reader(store))["m.weight"]
        assert_within_one_step(out, torch.from_numpy(data[mode + "_d"]).to(torch.bfloat16))
    assert checked == 6


def test_mlx_affine_by_definition() -> None:
    """Without the MLX venv: ``w = scales * q + biases`` over groups, codes a little-endian bit stream."""
    from guard.convert.read.dequant import mlx

    generator = np.random.default_rng(10)
    for bits in (2, 3, 4, 5, 6, 8):
        codes = generator.integers(0, 2**bits, size=(8, 128), dtype=np.uint64)
        stream = np.zeros((8, 128 * bits // 32), dtype=np.uint64)
        for j in range(128):  # element j at bit j*bits, words little-endian
            for bit in range(bits):
                position = j * bits + bit
                stream[:, position // 32] |= (((codes[:, j] >> np.uint64(bit)) & np.uint64(1))
                                              << np.uint64(position % 32))
        scales = generator.standard_normal((8, 4)).astype(np.float32)
        biases = generator.standard_normal((8, 4)).astype(np.float32)
        store = {"m.weight": stream.astype(np.uint32), "m.scales": scales, "m.biases": biases}
        out = mlx.dequantize(module("m", store, "m.weight"), quant(quantization={"bits": bits, "group_size": 32}),
                             reader(store))["m.weight"]
        expected = scales.repeat(32, axis=1) * codes.astype(np.float32) + biases.repeat(32, axis=1)
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_mlx_per_module_overrides_win_over_the_model_record() -> None:
    from guard.convert.read.dequant import mlx

    q = quant(quantization={"group_size": 64, "bits": 4, "model.layers.0.mlp.up_proj": {"group_size": 32, "bits": 8}})
    mod = SimpleNamespace(prefix="model.layers.0.mlp.up_proj")
    assert mlx.settings(mod, q)[1:] == (8, 32)
    assert mlx.settings(SimpleNamespace(prefix="lm_head"), q)[1:] == (4, 64)


# ---------------------------------------------------------------- torchao


def _torchao_read(folder: Path) -> tuple[Any, Any]:
    """(scan of the weights, read(name)) over the files torchao wrote, read as the scanner reads them."""
    from guard.convert.read.io_torch import read_range
    from guard.inventory import scan_local_file
    from guard.readers.torch.zip import read_torch_zip
    from guard.sources import LocalFile

    path = next(p for p in sorted(folder.iterdir()) if p.suffix in (".bin", ".safetensors"))
    scan = scan_local_file(path)
    infos = scan.tensors
    if path.suffix == ".bin":
        with LocalFile(path, name=str(path)) as source:
            infos = read_torch_zip(source, locate_data=True).tensors
    by_name = {info.name: info for info in infos}
    return scan, lambda name: read_range(by_name[name])


def _torchao_references(folder: Path) -> dict[str, Any]:
    """The subclass tensors as torchao rebuilds them: torch.load of the pickle (our own file; torchao
    registers its classes as safe globals), or torchao's ``unflatten_tensor_state_dict`` for safetensors."""
    import torchao.quantization  # noqa: F401  (registers the subclasses with torch's weights-only loader)

    if (folder / "pytorch_model.bin").exists():
        return torch.load(folder / "pytorch_model.bin", weights_only=True)
    from safetensors import safe_open
    from safetensors.torch import load_file
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    path = folder / "model.safetensors"
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    return unflatten_tensor_state_dict(load_file(str(path)), metadata)[0]


TORCHAO_TYPES = {"int8": "Int8Tensor", "int8-dynamic": "Int8Tensor", "intx": "IntxUnpackedToInt8Tensor",
                 "float8": "Float8Tensor", "float8-bin": "Float8Tensor"}


@pytest.mark.parametrize("kind", sorted(TORCHAO_TYPES))
def test_torchao_equals_its_own_dequantize(tmp_path: Path, kind: str) -> None:
    from quant_writers import write_torchao

    from guard.convert.read.dequant import torchao
    from guard.readers.torch.tensors import torchao_subclasses

    folder = write_torchao(tmp_path / kind, kind=kind)
    scan, read = _torchao_read(folder)
    assert not [f for f in scan.findings if f.code == "CG003"]
    subclasses = torchao_subclasses(scan.metadata)
    name = "model.layers.0.mlp.down_proj.weight"
    assert subclasses[name]["_type"] == TORCHAO_TYPES[kind]
    references = _torchao_references(folder)
    checked = 0
    for logical in subclasses:
        prefix, _, attr = logical.rpartition(".")
        store_payload = f"{prefix}._{attr}_qdata"
        components = {role: f"{prefix}._{attr}_{role}" for role in ("scale", "zero_point")}
        mod = SimpleNamespace(prefix=prefix, payload=store_payload, weight=logical,
                              components={k: v for k, v in components.items()
                                          if v in {t.name for t in scan.tensors}},
                              logical_shape=None)
        out = torchao.dequantize(mod, quant(), read)
        reference = references[logical].dequantize()
        assert_within_one_step(out[logical], reference)
        checked += 1
    assert checked == 14  # 2 layers x 7 linear modules; lm_head stays unquantized


def test_torchao_pickles_list_components_with_the_logical_shape(tmp_path: Path) -> None:
    from quant_writers import write_torchao

    from guard.readers.torch.tensors import torchao_subclasses

    scan, _ = _torchao_read(write_torchao(tmp_path / "int8", kind="int8"))
    names = {t.name: (t.dtype, t.shape) for t in scan.tensors}
    assert names["model.layers.0.mlp.down_proj._weight_qdata"] == ("I8", (128, 256))
    assert names["model.layers.0.mlp.down_proj._weight_scale"][1] == (128, 1)
    assert "model.layers.0.mlp.down_proj._weight_zero_point" in names
    assert "model.layers.0.mlp.down_proj.weight" not in names
    record = torchao_subclasses(scan.metadata)["model.layers.0.mlp.down_proj.weight"]
    assert record["shape"] == [128, 256] and record["dtype"] == "bfloat16" and record["block_size"] == [1, 256]
    assert "pickle_globals" not in scan.metadata


def test_a_foreign_global_beside_torchao_subclasses_is_still_cg003(tmp_path: Path) -> None:
    import datetime

    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from guard.inventory import scan_local_file

    layer = torch.nn.Sequential(torch.nn.Linear(64, 32)).to(torch.bfloat16)
    quantize_(layer, Int8WeightOnlyConfig(version=2))
    state = dict(layer.state_dict())
    state["when"] = datetime.date(2026, 1, 1)
    torch.save(state, tmp_path / "pytorch_model.bin")
    scan = scan_local_file(tmp_path / "pytorch_model.bin")
    assert [f.code for f in scan.findings if f.code == "CG003"] == ["CG003"]
    assert "datetime.date" in scan.metadata["pickle_globals"]
    assert "0._weight_qdata" in {t.name for t in scan.tensors}


def test_an_unknown_tensor_subclass_stays_cg003(tmp_path: Path) -> None:
    """Only torchao's own quantized classes are descriptions: the same rebuild naming another class is refused."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from guard.inventory import scan_local_file
    from guard.readers.torch.pickle import TORCHAO_SUBCLASSES, TORCHAO_VALUES

    assert not any(name.startswith(("builtins.", "os.", "torch.")) for name in TORCHAO_SUBCLASSES | TORCHAO_VALUES)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 32)).to(torch.bfloat16)
    quantize_(layer, Int8WeightOnlyConfig(version=2))
    legacy = tmp_path / "legacy.bin"  # the pre-zip format: no CRC, so the pickle can be edited in place
    torch.save(layer.state_dict(), legacy, _use_new_zipfile_serialization=False)
    assert scan_local_file(legacy).metadata.get("torchao_subclasses")
    forged = tmp_path / "forged.bin"
    data = legacy.read_bytes()
    assert data.count(b"torchao.quantization\nInt8Tensor") == 1
    forged.write_bytes(data.replace(b"torchao.quantization\nInt8Tensor", b"torchao.quantization\nNotATensor"))
    scan = scan_local_file(forged)
    assert [f.code for f in scan.findings if f.code == "CG003"] == ["CG003"]
    assert "torchao.quantization.NotATensor" in scan.metadata["pickle_globals"]
    assert "torchao_subclasses" not in scan.metadata


# ---------------------------------------------------------------- whole model folders, read as convert reads them

_F8 = {"num_bits": 8, "type": "float", "symmetric": True}
COMPRESSED_SCHEMES: dict[str, tuple[dict[str, Any], dict[str, Any] | None, str]] = {  # weights, activations, format
    "fp8": ({**_F8, "strategy": "channel"}, {**_F8, "strategy": "token", "dynamic": True}, "float-quantized"),
    "fp8-tensor": ({**_F8, "strategy": "tensor"}, {**_F8, "strategy": "token", "dynamic": True}, "float-quantized"),
    "fp8-block": ({**_F8, "strategy": "block", "block_structure": [128, 128]},
                  {**_F8, "strategy": "group", "group_size": 128, "dynamic": True}, "float-quantized"),
    "w8a8": ({"num_bits": 8, "symmetric": True, "strategy": "channel"},
             {"num_bits": 8, "symmetric": True, "strategy": "token", "dynamic": True}, "int-quantized"),
    "w4a16": ({"num_bits": 4, "symmetric": True, "strategy": "group", "group_size": 64}, None, "pack-quantized"),
    "w4a16-asym": ({"num_bits": 4, "symmetric": False, "strategy": "group", "group_size": 64}, None, "pack-quantized"),
    "nvfp4": ({"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16}, None,
              "nvfp4-pack-quantized"),
}


def write_compressed_tensors(out: Path, scheme: str = "fp8") -> Path:
    """A tiny Llama through compressed-tensors' own API (llmcompressor needs transformers 5): the quantization
    config applied, each module's scales and zero points set by the library's ``calculate_qparams`` from the
    weight's min/max (what a min-max observer computes), ``ModelCompressor.compress_model``, save_pretrained,
    ``update_config``.  ``lm_head`` is ignored, as recipes do."""
    from compressed_tensors.compressors.model_compressors.model_compressor import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
    from quant_writers import tiny_llama

    weights_args, input_args, fmt = COMPRESSED_SCHEMES[scheme]
    weights = QuantizationArgs(**weights_args)
    model = tiny_llama()
    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(
        targets=["Linear"], weights=weights,
        input_activations=QuantizationArgs(**input_args) if input_args else None)}, ignore=["lm_head"], format=fmt)
    apply_quantization_config(model, config)
    for module in model.modules():
        if not hasattr(module, "weight_scale"):
            continue
        w = module.weight.detach().float()
        rows, cols = w.shape
        if weights.strategy == "channel":
            low, high = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        elif weights.strategy == "tensor":
            low, high = w.amin().reshape(1), w.amax().reshape(1)
        elif weights.strategy == "block":
            br, bc = -(-rows // 128), -(-cols // 128)
            blocks = torch.nn.functional.pad(w, (0, bc * 128 - cols, 0, br * 128 - rows)).reshape(br, 128, bc, 128)
            low, high = blocks.amin((1, 3)), blocks.amax((1, 3))
        else:
            groups = w.reshape(rows, -1, weights.group_size)
            low, high = groups.amin(-1), groups.amax(-1)
        global_scale = None
        if hasattr(module, "weight_global_scale"):
            global_scale = generate_gparam(w.amin(), w.amax())
            module.weight_global_scale.data = global_scale.reshape(module.weight_global_scale.shape).to(
                module.weight_global_scale.dtype)
        scale, zero = calculate_qparams(low, high, weights, global_scale=global_scale)
        module.weight_scale.data = scale.reshape(module.weight_scale.shape).to(module.weight_scale.dtype)
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data = zero.reshape(module.weight_zero_point.shape).to(
                module.weight_zero_point.dtype)
    compressor = ModelCompressor(quantization_config=config)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    return out


@pytest.mark.parametrize("scheme", sorted(COMPRESSED_SCHEMES))
def test_compressed_tensors_folders_equal_the_compressors_decompress(tmp_path: Path, scheme: str) -> None:
    """Every module of a folder compressed-tensors wrote, against its compressor's ``decompress`` of the same
    stored tensors.  (transformers' ``run_compressed=False`` load agrees too, except NVFP4, where it holds
    ``weight_global_scale`` in a bf16 parameter and so rounds it, and asymmetric packing, which it fails to load.)"""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file

    folder = write_compressed_tensors(tmp_path / scheme, scheme)
    stored = load_file(str(folder / "model.safetensors"))
    record = json.loads((folder / "config.json").read_text())["quantization_config"]
    library_scheme = QuantizationScheme.model_validate(record["config_groups"]["group_0"])
    compressor = BaseCompressor.get_value_from_registry(record["format"])
    found, deq, modules, read = set_modules(folder)
    assert found.method == "compressed-tensors" and len(modules) == 14
    for mod in modules:
        local = {k[len(mod.prefix) + 1:]: v for k, v in stored.items() if k.startswith(mod.prefix + ".")}
        reference = compressor.decompress(local, library_scheme)["weight"]
        out = deq.dequantize(mod, found, read)
        assert list(out) == [mod.weight]
        assert_within_one_step(out[mod.weight], reference)
        assert deq.outputs(mod, found, read) == {mod.weight: tuple(reference.shape)}


def test_deepseek_style_fp8_folders_equal_compressed_tensors_block_dequantization(tmp_path: Path) -> None:
    """Fine-grained FP8 (``quant_method: fp8``, ``weight_scale_inv``; written to the spec: transformers 4.57
    quantizes it on GPUs only), every module against compressed-tensors' BLOCK strategy."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize
    from quant_spec_writers import write_fp8_block

    found, deq, modules, read = set_modules(write_fp8_block(tmp_path / "fp8"))
    assert found.method == "fp8"
    block = found.params.get("weight_block_size") or [128, 128]
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="block", block_structure=list(block))
    for mod in modules:
        weight = torch.from_numpy(read(mod.payload).view(np.uint8)).view(torch.float8_e4m3fn)
        scale = torch.from_numpy(read(mod.components["scales"]).astype(np.float32))
        reference = ct_dequantize(x_q=weight, scale=scale, args=args, dtype=torch.float32)
        assert_within_one_step(deq.dequantize(mod, found, read)[mod.weight], reference)


_MLX_FILES_SCRIPT = """
import json, sys, numpy as np, mlx.core as mx
from pathlib import Path
folder = Path(sys.argv[1])
record = json.loads((folder / "config.json").read_text())["quantization"]
arrays = {}
for path in sorted(folder.glob("*.safetensors")):
    arrays.update(mx.load(str(path)))
out = {}
for name in arrays:
    if not name.endswith(".scales"):
        continue
    prefix = name[: -len(".scales")]
    own = record.get(prefix) if isinstance(record.get(prefix), dict) else record
    mode = own.get("mode", "affine")
    biases = arrays.get(prefix + ".biases")
    if biases is not None:  # evaluated in f32: in bf16 mlx rounds the product, then the sum
        biases = biases.astype(mx.float32)
    scales = arrays[name].astype(mx.float32) if mode == "affine" else arrays[name]
    value = mx.dequantize(arrays[prefix + ".weight"], scales, biases, group_size=own["group_size"],
                          bits=own["bits"], mode=mode)
    out[prefix + ".weight"] = np.array(value.astype(mx.float32))
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("bits,group,mode", [(4, 64, "affine"), (8, 64, "affine"), (3, 32, "affine"),
                                             (4, 32, "mxfp4")])
def test_mlx_lm_folders_equal_mlx_core_dequantize(tmp_path: Path, bits: int, group: int, mode: str) -> None:
    """Folders mlx-lm wrote (its own venv), every module (embeddings and lm_head included) against mlx itself."""
    from quant_mlx import MlxUnavailable, mlx_python, write_mlx

    try:
        python = mlx_python()
        folder = write_mlx(tmp_path / "mlx", bits=bits, group_size=group, mode=mode)
    except MlxUnavailable as exc:
        pytest.skip(str(exc))
    subprocess.run([str(python), "-c", _MLX_FILES_SCRIPT, str(folder), str(tmp_path / "ref.npz")], check=True,
                   timeout=300)
    reference = np.load(tmp_path / "ref.npz")
    found, deq, modules, read = set_modules(folder)
    assert found.method == "mlx"
    assert {m.weight for m in modules} == set(reference.files)
    for mod in modules:
        assert_within_one_step(deq.dequantize(mod, found, read)[mod.weight], torch.from_numpy(reference[mod.weight]))


def test_modelopt_and_fbgemm_folders_dequantize_every_module(tmp_path: Path) -> None:
    """ModelOpt FP8/NVFP4 and FBGEMM FP8 (written to the spec), every module by its definition."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from quant_spec_writers import write_fbgemm_fp8, write_modelopt

    for folder in (write_modelopt(tmp_path / "fp8"), write_modelopt(tmp_path / "nvfp4", algo="NVFP4"),
                   write_fbgemm_fp8(tmp_path / "fbgemm")):
        found, deq, modules, read = set_modules(folder)
        for mod in modules:
            payload, scale = read(mod.payload), torch.from_numpy(read(mod.components["scales"]).astype(np.float32))
            if payload.dtype == np.uint8:
                rows, half = payload.shape
                values = unpack_fp4_from_uint8(torch.from_numpy(payload), rows, half * 2, dtype=torch.float32)
                second = float(read(mod.components["scale_2"]).astype(np.float32).reshape(-1)[0])
                expected = values * scale.repeat_interleave(16, dim=1) * second
            else:
                expected = torch.from_numpy(payload.astype(np.float32)) * scale
            assert_within_one_step(deq.dequantize(mod, found, read)[mod.weight], expected)


# ---------------------------------------------------------------- `convert --dequantize`, end to end


def _convert_dequantized(src: Path, out: Path) -> dict[str, Any]:
    """``ckpt-guard convert --to torch --dequantize --dtype bf16``; the output loaded by transformers, strictly."""
    from transformers import AutoModelForCausalLM

    from guard.cli import main

    assert main(["convert", str(src), "--to", "torch", "--out", str(out), "--dequantize", "--dtype", "bf16"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, dtype="auto")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return {name: value.detach() for name, value in model.state_dict().items()}


def test_convert_dequantize_compressed_tensors_loads_and_equals_the_compressor(tmp_path: Path) -> None:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file

    src = write_compressed_tensors(tmp_path / "w4a16", "w4a16")
    loaded = _convert_dequantized(src, tmp_path / "out")
    stored = load_file(str(src / "model.safetensors"))
    scheme = QuantizationScheme.model_validate(
        json.loads((src / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"])
    prefix = "model.layers.1.self_attn.o_proj"
    local = {k[len(prefix) + 1:]: v for k, v in stored.items() if k.startswith(prefix + ".")}
    reference = PackedQuantizationCompressor.decompress(local, scheme)["weight"]
    assert loaded[f"{prefix}.weight"].dtype == torch.bfloat16
    assert torch.equal(loaded[f"{prefix}.weight"], reference.to(torch.bfloat16))
    assert torch.equal(loaded["lm_head.weight"], stored["lm_head.weight"])  # ignored by the recipe: copied


def test_convert_dequantize_gpt_oss_loads_and_equals_transformers(tmp_path: Path) -> None:
    from quant_spec_writers import write_mxfp4
    from transformers import AutoModelForCausalLM, Mxfp4Config

    src = write_mxfp4(tmp_path / "gpt-oss")
    loaded = _convert_dequantized(src, tmp_path / "out")
    reference = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16,
                                                     quantization_config=Mxfp4Config(dequantize=True)).state_dict()
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"):
        assert torch.equal(loaded[name].to(torch.bfloat16), reference[name])


def test_convert_dequantize_refuses_nan_scales_and_writes_nothing(tmp_path: Path, capsys: Any) -> None:
    """A NaN scale (compressed-tensors) or an E8M0 0xFF (gpt-oss): CG205 naming the tensor, nothing written."""
    from quant_spec_writers import write_mxfp4
    from test_values_quantized import plant, set_bf16

    from guard.cli import main

    src = write_compressed_tensors(tmp_path / "fp8", "fp8")
    plant(src / "model.safetensors", "model.layers.1.mlp.up_proj.weight_scale", set_bf16(2, float("nan")))
    gpt = write_mxfp4(tmp_path / "gpt-oss")

    def nan_exponents(view: Any) -> None:
        view[4] = 0xFF

    plant(gpt / "model.safetensors", "model.layers.0.mlp.experts.gate_up_proj_scales", nan_exponents)
    for folder, tensor in ((src, "model.layers.1.mlp.up_proj.weight_scale"),
                           (gpt, "model.layers.0.mlp.experts.gate_up_proj_scales")):
        out = tmp_path / f"out-{folder.name}"
        assert main(["convert", str(folder), "--to", "torch", "--out", str(out), "--dequantize"]) != 0
        assert not out.exists()
        said = capsys.readouterr()
        assert "CG205" in said.out + said.err and tensor in said.out + said.err


@pytest.mark.parametrize("kind", ["int8", "float8"])
def test_convert_dequantize_torchao_loads_and_equals_its_dequantize(tmp_path: Path, kind: str) -> None:
    """torchao's pickle (read by the walker, never unpickled) and its safetensors, back to a plain bf16 model."""
    from quant_writers import write_torchao

    src = write_torchao(tmp_path / kind, kind=kind)
    loaded = _convert_dequantized(src, tmp_path / "out")
    references = _torchao_references(src)
    for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.q_proj.weight"):
        assert torch.equal(loaded[name], references[name].dequantize().to(torch.bfloat16))


def _read_back_runs(monkeypatch: pytest.MonkeyPatch, src: Path, out: Path, *, tamper: bool) -> tuple[int, int, Any]:
    """``convert --dequantize`` of ``src``: its exit code, how many whole-module dequantizations ran, and the
    report; ``tamper`` changes the first element of every module the writer is handed (a pipeline defect
    between the dequantizer and the file)."""
    from guard.cli import main
    from guard.convert.read.dequant import source

    calls = [0]
    real_dequantize, real_load = source._Modules.arrays, source._ModuleLoader.load

    def counting(self: Any, module: Any) -> Any:
        if self.current[0] is not module:
            calls[0] += 1
        return real_dequantize(self, module)

    def tampered(self: Any, info: Any) -> Any:
        array = real_load(self, info).copy()
        array.reshape(-1)[0] += np.float32(1.0)
        return array

    monkeypatch.setattr(source._Modules, "arrays", counting)
    if tamper:
        monkeypatch.setattr(source._ModuleLoader, "load", tampered)
    report = out.parent / "report.json"
    code = main(["convert", str(src), "--to", "torch", "--out", str(out), "--dequantize", "--dtype", "bf16",
                 "--format", "json", "-o", str(report)])
    return code, calls[0], json.loads(report.read_text())


def test_fp8_read_back_recomputes_only_the_sampled_elements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-back check of fine-grained FP8 recomputes its samples from the source's bytes (fp8.elements),
    bit for bit what ``dequantize`` makes, without dequantizing any module a second time; a value changed
    between the dequantizer and the file is still CG301, nothing written."""
    from quant_spec_writers import write_fp8_block

    from guard.convert.read.dequant import fp8

    src = write_fp8_block(tmp_path / "fp8", block=16)
    found, deq, modules, read = set_modules(src)
    code, calls, _ = _read_back_runs(monkeypatch, src, tmp_path / "out", tamper=False)
    assert code == 0 and calls == len(modules)
    code, _, report = _read_back_runs(monkeypatch, src, tmp_path / "bad", tamper=True)
    assert code == 1 and "CG301" in {f["code"] for f in report["findings"] if f["severity"] == "error"}
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad.partial-*"))
    # elements() against the whole module, every element, ragged edges included
    for shape, block in (((200, 300), (128, 128)), ((96, 160), (64, 32))):
        _, quantized, scale_inv = _deepseek_fp8(*shape, block)
        store = {"m.weight": to_numpy(quantized), "m.weight_scale_inv": to_numpy(scale_inv)}
        infos = {k: SimpleNamespace(dtype="F8_E4M3" if k == "m.weight" else "F32", shape=v.shape)
                 for k, v in store.items()}
        read = reader(store)
        read.info = infos.__getitem__  # type: ignore[attr-defined]
        # called within this iteration: store is this shape's
        read.elements = lambda name, flat: store[name].reshape(-1)[flat]  # type: ignore[attr-defined]  # noqa: B023
        mod, q = module("m", store, "m.weight"), quant(weight_block_size=list(block))
        whole = fp8.dequantize(mod, q, read)["m.weight"].reshape(-1)
        flat = list(range(whole.size))
        assert np.array_equal(fp8.elements(mod, q, read, "m.weight", flat).view(np.uint32), whole.view(np.uint32))
