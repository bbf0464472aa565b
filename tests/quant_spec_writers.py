"""Quantized layouts with no CPU writer here, written to their loaders' spec on the tiny Llama of
``quant_writers`` (gpt-oss for MXFP4). The weights are really quantized (round-to-nearest with the
method's own scales), so a reader someone else wrote dequantizes them back close to the twin:
transformers' ``Mxfp4Config(dequantize=True)`` for MXFP4, compressed-tensors' ``AutoAWQConverter``,
``FP8BlockDequantizer`` and ``ModelOptNvfp4Converter`` for AWQ, FP8 block and ModelOpt NVFP4, auto-gptq
0.7.1's torch dequantization for GPTQ; transformers loads FBGEMM FP8 (``FbgemmFp8Linear``) and BitNet
(``BitLinear``) with no key missing or mismatched (tests/test_quantized_layouts.py). EETQ has no CPU reader.

Layouts (logical [out, in] = [128, 256] for ``mlp.down_proj``), each checked against the loader:
- GPTQ (auto-gptq / gptqmodel ``QuantLinear``): ``qweight`` I32 [in*bits/32, out], ``qzeros`` I32
  [in/g, out*bits/32] (v1: zero - 1), ``scales`` F16 [in/g, out], ``g_idx`` I32 [in]; compute fp16.
- AWQ gemm (AutoAWQ ``WQLinear_GEMM``): ``qweight`` I32 [in, out/8] and ``qzeros`` I32 [in/g, out/8]
  in the order 0,2,4,6,1,3,5,7; ``scales`` F16 [in/g, out].
- FP8 block (DeepSeek-V3, transformers ``FP8Linear``): ``weight`` F8_E4M3, ``weight_scale_inv`` F32
  [ceil(out/128), ceil(in/128)], multiplied in (the name is historical).
- FBGEMM FP8 (transformers ``FbgemmFp8Linear``): ``weight`` F8_E4M3, ``weight_scale`` F32 [out, 1].
- ModelOpt FP8: ``weight`` F8_E4M3, ``weight_scale`` and ``input_scale`` F32 []; NVFP4: ``weight``
  U8 [out, in/2], ``weight_scale`` F8_E4M3 [out, in/16], ``weight_scale_2`` and ``input_scale`` F32 [];
  hf_quant_config.json beside config.json.
- MXFP4 (gpt-oss): ``mlp.experts.gate_up_proj_blocks`` U8 [E, 2*inter, hidden/32, 16] and
  ``_scales`` U8 [E, 2*inter, hidden/32] (E8M0), ``down_proj_blocks`` [E, hidden, inter/32, 16];
  biases, attention, router, embeddings stay bf16.
- EETQ (eetq ``EetqLinear``): ``weight`` I8 [in, out], ``weight_scales`` F16 [out] (real EETQ files
  interleave rows for its CUDA kernel; nothing here can write that).
- BitNet (transformers ``pack_weights``): ``weight`` U8 [out/4, in], ``weight_scale`` BF16 [1].
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
E4M3_MAX = 448.0


def _llama_linears(model: Any) -> dict[str, Any]:
    """prefix -> fp32 weight [out, in] of every Linear the quantizers pack (lm_head stays)."""
    layers = model.config.num_hidden_layers
    state = model.state_dict()
    return {f"model.layers.{i}.{name}": state[f"model.layers.{i}.{name}.weight"].float()
            for i in range(layers) for name in LINEARS}


def _save(out: Path, model: Any, packed: dict[str, Any], quantization: dict[str, Any] | None, *,
          dtype: str, replaced: set[str], extra: dict[str, Any] | None = None) -> Path:
    """Unpacked tensors in the compute dtype plus ``packed``; config.json as save_pretrained writes it."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in model.state_dict().items()
               if k not in replaced}
    tensors.update({k: v.contiguous() for k, v in packed.items()})
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["dtype"] = dtype
    if quantization is not None:
        config["quantization_config"] = quantization
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name, record in (extra or {}).items():
        (out / name).write_text(json.dumps(record, indent=2) + "\n")
    return out


def _pack_int32(values: Any, bits: int, *, dim: int, order: tuple[int, ...] | None = None) -> Any:
    """Pack unsigned ``bits``-wide ints along ``dim``, 32/bits per int32, first value in the low bits."""
    import torch

    per = 32 // bits
    order = order or tuple(range(per))
    moved = values.to(torch.int64).movedim(dim, -1)
    grouped = moved.unflatten(-1, (-1, per))[..., list(order)]
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    packed = (grouped << shifts).sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.movedim(-1, dim)


def _round_to_nearest_int(weight_in_out: Any, group_of_row: Any, groups: int, bits: int, *,
                          sym: bool) -> tuple[Any, Any, Any]:
    """Round-to-nearest per (group, column): q [in, out], scales [groups, out], zeros [groups, out]."""
    import torch

    maxq = 2**bits - 1
    scales = torch.empty(groups, weight_in_out.shape[1])
    zeros = torch.empty(groups, weight_in_out.shape[1])
    for group in range(groups):
        rows = weight_in_out[group_of_row == group]
        low, high = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
        if sym:
            scales[group] = (torch.maximum(-low, high) * 2 / maxq).clamp(min=1e-8)
            zeros[group] = (maxq + 1) // 2
        else:
            scales[group] = ((high - low) / maxq).clamp(min=1e-8)
            zeros[group] = torch.round(-low / scales[group]).clamp(0, maxq)
    scales = scales.half().float()  # the stored scales are fp16: quantize against what is stored
    q = torch.round(weight_in_out / scales[group_of_row]) + zeros[group_of_row]
    return q.clamp(0, maxq), scales, zeros


def write_gptq(out: Path, *, bits: int = 4, group_size: int = 128, desc_act: bool = False, sym: bool = True,
               checkpoint_format: str = "gptq", legacy_config: bool = False) -> Path:
    """GPTQ as auto-gptq (``checkpoint_format`` gptq: zeros stored minus one) or gptqmodel (gptq_v2)
    saves it; ``legacy_config`` writes the old quantize_config.json and no quantization_config."""
    import torch
    from quant_writers import tiny_llama

    if 32 % bits:
        raise ValueError("3-bit GPTQ packs across int32 words; only 2, 4 and 8 bits are written here")
    model = tiny_llama(dtype="float16")
    generator = torch.Generator().manual_seed(1)
    packed: dict[str, Any] = {}
    for prefix, weight in _llama_linears(model).items():
        width = weight.shape[1]
        size = width if group_size == -1 else group_size
        order = torch.randperm(width, generator=generator) if desc_act else torch.arange(width)
        g_idx = torch.empty(width, dtype=torch.int64)
        g_idx[order] = torch.arange(width) // size
        q, scales, zeros = _round_to_nearest_int(weight.T, g_idx, width // size, bits, sym=sym)
        stored_zeros = (zeros - 1 if checkpoint_format == "gptq" else zeros).to(torch.int64) & (2**bits - 1)
        packed[f"{prefix}.qweight"] = _pack_int32(q, bits, dim=0)
        packed[f"{prefix}.qzeros"] = _pack_int32(stored_zeros, bits, dim=1)
        packed[f"{prefix}.scales"] = scales.half()
        packed[f"{prefix}.g_idx"] = g_idx.to(torch.int32)
    record = {"bits": bits, "group_size": group_size, "damp_percent": 0.01, "desc_act": desc_act,
              "static_groups": False, "sym": sym, "true_sequential": True, "model_name_or_path": None,
              "model_file_base_name": "model", "quant_method": "gptq", "checkpoint_format": checkpoint_format}
    replaced = {f"{p}.weight" for p in _llama_linears(model)}
    if legacy_config:
        return _save(out, model, packed, None, dtype="float16", replaced=replaced,
                     extra={"quantize_config.json": record})
    return _save(out, model, packed, record, dtype="float16", replaced=replaced)


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def write_awq(out: Path, *, group_size: int = 128) -> Path:
    """AutoAWQ gemm, 4 bits, zero point (what ``AutoAWQForCausalLM.save_quantized`` writes)."""
    import torch
    from quant_writers import tiny_llama

    model = tiny_llama(dtype="float16")
    packed: dict[str, Any] = {}
    for prefix, weight in _llama_linears(model).items():
        width = weight.shape[1]
        groups = torch.arange(width) // group_size
        q, scales, zeros = _round_to_nearest_int(weight.T, groups, width // group_size, 4, sym=False)
        packed[f"{prefix}.qweight"] = _pack_int32(q, 4, dim=1, order=AWQ_ORDER)
        packed[f"{prefix}.qzeros"] = _pack_int32(zeros, 4, dim=1, order=AWQ_ORDER)
        packed[f"{prefix}.scales"] = scales.half()
    record = {"quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": "gemm",
              "modules_to_not_convert": None}
    return _save(out, model, packed, record, dtype="float16",
                 replaced={f"{p}.weight" for p in _llama_linears(model)})


def _fp8(weight: Any, scale: Any) -> Any:
    import torch

    return (weight / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def write_fp8_block(out: Path, *, block: int = 128) -> Path:
    """DeepSeek-V3 style fine-grained FP8: one F32 scale per 128x128 block, config as DeepSeek ships it."""
    import torch
    from quant_writers import tiny_llama

    model = tiny_llama()
    packed: dict[str, Any] = {}
    for prefix, weight in _llama_linears(model).items():
        rows, cols = weight.shape
        padded = torch.nn.functional.pad(weight, (0, -cols % block, 0, -rows % block))
        blocks = padded.unflatten(0, (-1, block)).unflatten(-1, (-1, block))
        scale = (blocks.abs().amax((1, 3)) / E4M3_MAX).clamp(min=1e-12)
        expanded = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
        packed[f"{prefix}.weight"] = _fp8(weight, expanded)
        packed[f"{prefix}.weight_scale_inv"] = scale.float()
    record = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
              "weight_block_size": [block, block]}
    return _save(out, model, packed, record, dtype="bfloat16", replaced=set(packed))


def write_fbgemm_fp8(out: Path) -> Path:
    """transformers' FbgemmFp8Config layout: per-row F32 scales, lm_head kept."""
    from quant_writers import tiny_llama

    model = tiny_llama()
    packed: dict[str, Any] = {}
    for prefix, weight in _llama_linears(model).items():
        scale = (weight.abs().amax(1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
        packed[f"{prefix}.weight"] = _fp8(weight, scale)
        packed[f"{prefix}.weight_scale"] = scale.float()
    record = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]}
    return _save(out, model, packed, record, dtype="bfloat16", replaced=set(packed))


def write_modelopt(out: Path, *, algo: str = "FP8") -> Path:
    """NVIDIA ModelOpt's export (``quant_method`` modelopt). NVFP4 starts from compressed-tensors'
    own NVFP4 compressor and renames it the way ModelOptNvfp4Converter maps it back (the packing is one)."""
    import torch
    from quant_writers import tiny_llama, write_compressed_tensors
    from safetensors.torch import load_file

    model = tiny_llama()
    packed: dict[str, Any] = {}
    if algo == "FP8":
        for prefix, weight in _llama_linears(model).items():
            scale = (weight.abs().amax() / E4M3_MAX).clamp(min=1e-12)
            packed[f"{prefix}.weight"] = _fp8(weight, scale)
            packed[f"{prefix}.weight_scale"] = scale.float().reshape(())
            packed[f"{prefix}.input_scale"] = torch.tensor(1.0 / E4M3_MAX)
    else:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            ct = load_file(str(write_compressed_tensors(Path(tmp), scheme="NVFP4") / "model.safetensors"))
        for prefix in _llama_linears(model):
            packed[f"{prefix}.weight"] = ct[f"{prefix}.weight_packed"]
            packed[f"{prefix}.weight_scale"] = ct[f"{prefix}.weight_scale"]
            packed[f"{prefix}.weight_scale_2"] = (1 / ct[f"{prefix}.weight_global_scale"].float()).reshape(())
            packed[f"{prefix}.input_scale"] = (1 / ct[f"{prefix}.input_global_scale"].float()).reshape(())
    quantization = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"],
                    **({"group_size": 16} if algo == "NVFP4" else {})}
    extra = {"hf_quant_config.json": {"producer": {"name": "modelopt", "version": "0.37.0"},
                                      "quantization": quantization}}
    return _save(out, model, packed, {"quant_method": "modelopt", **quantization}, dtype="bfloat16",
                 replaced={f"{p}.weight" for p in _llama_linears(model)}, extra=extra)


GPT_OSS_SIZES: dict[str, Any] = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
    "num_experts_per_tok": 2, "max_position_embeddings": 64, "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 32},
}
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def tiny_gpt_oss(*, seed: int = 0) -> Any:
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(seed)
    model = GptOssForCausalLM(GptOssConfig(**GPT_OSS_SIZES)).to(torch.bfloat16).eval()
    with torch.no_grad():  # the init leaves expert weights at zero: give them something to quantize
        for name, param in model.named_parameters():
            if ".experts." in name:
                param.normal_(0, 0.02)
    return model


def _mxfp4(rows_by_cols: Any) -> tuple[Any, Any]:
    """OCP MXFP4: blocks of 32 along the last dim, E8M0 shared exponent (bias 127), E2M1 nibbles,
    low nibble first: what convert_moe_packed_tensors reads."""
    import torch

    *lead, cols = rows_by_cols.shape
    groups = rows_by_cols.float().unflatten(-1, (cols // 32, 32))
    amax = groups.abs().amax(-1).clamp(min=2**-126)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    lut = torch.tensor(FP4_VALUES)
    index = (scaled[..., None] - lut).abs().argmin(-1).to(torch.uint8)
    blocks = index[..., 0::2] | (index[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


def write_mxfp4(out: Path) -> Path:
    """gpt-oss's MXFP4 experts (transformers Mxfp4GptOssExperts names), config as openai/gpt-oss ships it."""
    model = tiny_gpt_oss()
    state = model.state_dict()
    packed: dict[str, Any] = {}
    for i in range(model.config.num_hidden_layers):
        experts = f"model.layers.{i}.mlp.experts"
        for proj in ("gate_up_proj", "down_proj"):
            # stored [E, in, out]; packed as [E, out, in/32, 16] (the loader transposes back)
            blocks, scales = _mxfp4(state[f"{experts}.{proj}"].transpose(1, 2))
            packed[f"{experts}.{proj}_blocks"], packed[f"{experts}.{proj}_scales"] = blocks, scales
    record = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    replaced = {k.rsplit("_", 1)[0] for k in packed}
    return _save(out, model, packed, record, dtype="bfloat16", replaced=replaced)


def write_eetq(out: Path) -> Path:
    """EETQ int8 weight-only, per-output-channel fp16 scales, weight stored [in, out]."""
    from quant_writers import tiny_llama

    model = tiny_llama(dtype="float16")
    packed: dict[str, Any] = {}
    for prefix, weight in _llama_linears(model).items():
        scale = (weight.abs().amax(1) / 127).clamp(min=1e-8).half()
        packed[f"{prefix}.weight"] = (weight / scale.float()[:, None]).round().clamp(-127, 127).char().T
        packed[f"{prefix}.weight_scales"] = scale
    record = {"quant_method": "eetq", "weights": "int8", "modules_to_not_convert": ["lm_head"]}
    return _save(out, model, packed, record, dtype="float16", replaced=set(packed))


def write_bitnet(out: Path) -> Path:
    """BitNet b1.58 offline: absmean ternary weights packed by transformers' own ``pack_weights``."""
    import torch
    from quant_writers import tiny_llama
    from transformers.integrations.bitnet import pack_weights

    model = tiny_llama()
    packed: dict[str, Any] = {}
    for prefix, weight in _llama_linears(model).items():
        scale = (1.0 / weight.abs().mean().clamp(min=1e-5)).reshape(1).to(torch.bfloat16)
        packed[f"{prefix}.weight"] = pack_weights((weight * scale.float()).round().clamp(-1, 1))
        packed[f"{prefix}.weight_scale"] = scale
    record = {"quant_method": "bitnet", "modules_to_not_convert": ["lm_head"], "linear_class": "bitlinear",
              "quantization_mode": "offline"}
    return _save(out, model, packed, record, dtype="bfloat16", replaced=set(packed))
