"""Quantized checkpoints written by the real libraries the way users write them, on one tiny Llama.

Every ``write_<method>(dir, **opts) -> Path`` writes a complete model folder (config.json and weights)
into ``dir`` and returns it; nothing else lands there, so a scan of ``dir`` sees what a user's repo holds.
The unquantized twin (same seed, same sizes) is ``twin(writer)``: its ``num_parameters()`` is the
logical count a quantized set must report. Layouts with no CPU writer here (GPTQ, AWQ, FP8 block,
FBGEMM, ModelOpt, MXFP4, EETQ, BitNet) are in ``quant_spec_writers``; MLX (its own venv) in
``quant_mlx``; planted defects on any of them in ``quant_plants``. All are re-exported here.

Observed with transformers 4.57.6, bitsandbytes 0.50.2, hqq 0.2.8, optimum-quanto 0.2.7,
compressed-tensors 0.20.1, torchao 0.18 (one layer's ``mlp.down_proj``, logical [128, 256]):
- bnb nf4 + double quant: ``weight`` U8 [16384, 1], ``weight.absmax`` U8 [512], ``weight.nested_absmax``
  F32 [2], ``weight.nested_quant_map`` F32 [256], ``weight.quant_map`` F32 [16],
  ``weight.quant_state.bitsandbytes__nf4`` U8 [169] (JSON); quant_storage bf16: ``weight`` BF16 [8192, 1].
- bnb 8-bit: ``weight`` I8 [128, 256], ``SCB`` F32 [128], ``weight_format`` U8 [].
- HQQ (nbits 4, group 64): ``W_q`` U8 [256, 64], ``scale``/``zero`` F32 [512, 1], ``shape`` I64 [2],
  ``nbits``/``group_size``/``axis`` I32 [], ``packing`` U8 [7], ``compute_dtype`` U8 [13], flags U8 [];
  ``lm_head.weight`` F32 (skip_modules ["lm_head"]: transformers 4.57 keeps it fp32, a true finding), and
  every layer's ``compute_dtype`` is b"torch.float32" under config dtype bfloat16 (loaded in bf16, the
  first HQQ matmul fails; loaded in fp32 it runs). 3-bit: ``W_q`` I32 [52, 64] (10 values an int32).
- quanto qint4: ``weight._data._data`` U8 [128, 128], ``weight._scale``/``weight._shift`` BF16 [256, 1]
  (group 128); qint8: ``weight._data`` I8 [128, 256], ``weight._scale`` BF16 [128, 1], ``input_scale``
  and ``output_scale`` BF16 []; qfloat8: ``weight._data`` F8_E4M3. No quantization_config:
  ``quanto_qmap.json`` maps each module to {"weights": "qint4", "activations": "none"}.
- torchao Int8WeightOnly: ``pytorch_model.bin`` only (tensor subclasses); Float8WeightOnly safetensors:
  ``_weight_qdata`` F8_E4M3 [128, 256], ``_weight_scale`` F32 [128, 1], the subclass record per
  weight in the header's metadata (``{"_type": "Float8Tensor", ..., "_tensor_data_names": [...]}``).
- compressed-tensors (ignore ["lm_head"], format in each config group and at the top): W4A16
  pack-quantized ``weight_packed`` I32 [128, 32], ``weight_scale`` BF16 [128, 2], ``weight_shape`` I64 [2]
  (k_proj [64, 128]: scale [64, 1]); W4A16_ASYM adds ``weight_zero_point`` I32 [16, 2], packed along the
  *output* dim (transformers 4.57 cannot load it back: it expects [128, 2]); naive-quantized ``weight`` I8
  [128, 256] + ``weight_scale``; FP8 float-quantized ``weight`` F8_E4M3, ``weight_scale`` and
  ``input_scale`` BF16 [1]; FP8_BLOCK ``weight_scale`` BF16 [ceil(out/128), ceil(in/128)] ([1, 2]; gate_proj
  [2, 1]); W8A8 int-quantized ``weight`` I8, ``weight_scale`` BF16 [out, 1]; NVFP4 ``weight_packed`` U8
  [128, 128], ``weight_scale`` F8_E4M3 [128, 16], ``weight_global_scale`` and ``input_global_scale`` F32 [1].
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIZES: dict[str, Any] = {  # 128-wide so every method's group size (64, 128) divides every input width
    "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
SEED = 0


def tiny_llama(*, dtype: str = "bfloat16", seed: int = SEED) -> Any:
    """The full-precision model every Llama writer quantizes: 361,088 parameters."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**SIZES)).to(getattr(torch, dtype)).eval()


def twin(writer: Callable[..., Path]) -> Any:
    """The unquantized model a writer started from (``twin(write_hqq).num_parameters()``)."""

    return tiny_gpt_oss() if writer.__name__ == "write_mxfp4" else tiny_llama()


def _from_base(quantization_config: Any, *, dtype: str = "bfloat16") -> Any:
    """What users do: from_pretrained(repo, quantization_config=...) on a saved full-precision model."""
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as base:
        tiny_llama(dtype=dtype).save_pretrained(base)
        return AutoModelForCausalLM.from_pretrained(base, quantization_config=quantization_config,
                                                    device_map="cpu", dtype=getattr(torch, dtype))


def write_bnb_4bit(out: Path, *, quant_type: str = "nf4", double_quant: bool = False,
                   storage: str = "uint8") -> Path:
    """bitsandbytes 4-bit through BitsAndBytesConfig; ``storage`` is bnb_4bit_quant_storage."""
    import torch
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                bnb_4bit_use_double_quant=double_quant, bnb_4bit_compute_dtype=torch.bfloat16,
                                bnb_4bit_quant_storage=getattr(torch, storage))
    _from_base(config).save_pretrained(out)
    return out


def write_bnb_8bit(out: Path) -> Path:
    """bitsandbytes LLM.int8 through BitsAndBytesConfig(load_in_8bit=True)."""
    from transformers import BitsAndBytesConfig

    _from_base(BitsAndBytesConfig(load_in_8bit=True)).save_pretrained(out)
    return out


def write_hqq(out: Path, *, nbits: int = 4, group_size: int = 64) -> Path:
    """HQQ through transformers' HqqConfig (lm_head skipped, stored fp32 by transformers 4.57).  transformers
    5.25 refuses HqqConfig ("QuantizationMethod.HQQ is not available yet"): under 5 the layout is written
    by transformers 4.57 in the transformers-4 environment (.venv-tf4), as the published HQQ models were."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        return _in_transformers_4("write_hqq", out, nbits=nbits, group_size=group_size)
    from transformers import HqqConfig

    _from_base(HqqConfig(nbits=nbits, group_size=group_size)).save_pretrained(out)
    return out


def _in_transformers_4(writer: str, out: Path, **options: Any) -> Path:
    """This module's ``writer`` run by the transformers-4 environment's Python (tests/legacy_env.py)."""
    import os
    import subprocess

    from legacy_env import ROOT, legacy_python

    code = ("import json, sys; from pathlib import Path; sys.path.insert(0, 'tests'); import quant_writers; "
            "getattr(quant_writers, sys.argv[1])(Path(sys.argv[2]), **json.loads(sys.argv[3]))")
    done = subprocess.run([str(legacy_python()), "-c", code, writer, str(out), json.dumps(options)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "USE_TF": "0"})
    assert done.returncode == 0, f"{writer} in .venv-tf4: {done.stderr[-3000:]}"
    return out


def write_quanto(out: Path, *, weights: str = "qint4") -> Path:
    """optimum-quanto's own QuantizedModelForCausalLM (transformers' QuantoConfig cannot save):
    quantize + freeze, save_pretrained, quanto_qmap.json. ``weights``: qint2, qint4, qint8, qfloat8."""
    from optimum.quanto import QuantizedModelForCausalLM

    QuantizedModelForCausalLM.quantize(tiny_llama(), weights=weights, exclude="lm_head").save_pretrained(out)
    return out


TORCHAO_KINDS = {  # kind -> (torchao config class, saved as safetensors)
    "int8": ("Int8WeightOnlyConfig", False),  # transformers 4.57 refuses safetensors for all but Float8Tensor
    "int8-dynamic": ("Int8DynamicActivationInt8WeightConfig", False),
    "intx": ("IntxWeightOnlyConfig", False),
    "float8": ("Float8WeightOnlyConfig", True),
    "float8-bin": ("Float8WeightOnlyConfig", False),
}


def write_torchao(out: Path, *, kind: str = "int8") -> Path:
    """torchao through TorchAoConfig, saved as transformers saves it: ``int8`` weight-only pickles tensor
    subclasses into pytorch_model.bin (safetensors refuses them); ``float8`` weight-only saves
    safetensors with the subclass records in the header. Int4 needs mslk, dynamic float8 CUDA sm89.
    The pickled kinds are transformers 4's layout (5 writes safetensors only): under 5, .venv-tf4 writes them."""
    import torchao.quantization
    import transformers
    from transformers import TorchAoConfig

    name, safe = TORCHAO_KINDS[kind]
    if not safe and int(transformers.__version__.split(".")[0]) >= 5:
        return _in_transformers_4("write_torchao", out, kind=kind)
    _from_base(TorchAoConfig(getattr(torchao.quantization, name)())).save_pretrained(out, safe_serialization=safe)
    return out


def safetensors_listing(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype code, shape) over every safetensors file in ``folder``, read by safetensors."""
    from safetensors import safe_open

    listing: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "np") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                piece = handle.get_slice(name)
                listing[name] = (piece.get_dtype(), tuple(piece.get_shape()))
    return listing


def quantization_config(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "config.json").read_text()).get("quantization_config") or {})


def write_compressed_tensors(out: Path, *, scheme: str = "W4A16", format: str | None = None,  # noqa: A002
                             ignore: tuple[str, ...] = ("lm_head",)) -> Path:
    """compressed-tensors' own API, as llmcompressor drives it (llmcompressor needs transformers 5):
    apply_quantization_config, a min-max calibration of the weights (llmcompressor's default observer),
    ModelCompressor.compress_model, save_pretrained, update_config.

    ``scheme`` is a preset (W4A16 and W4A16_ASYM -> pack-quantized, FP8 and FP8_BLOCK ->
    float-quantized, W8A8 -> int-quantized, NVFP4 -> nvfp4-pack-quantized); ``format`` forces the
    compressor (``naive-quantized`` stores W4A16's ints unpacked, one I8 per weight); ``ignore`` is the
    config's list of modules kept unquantized. compressed-tensors
    0.20 removed its sparsity compressors, so no sparse format is written here.
    """
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme

    model = tiny_llama()
    inputs = _input_ranges(model)
    config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(scheme, ["Linear"])},
                                ignore=list(ignore))
    apply_quantization_config(model, config, show_progress=False)
    for name, module in model.named_modules():
        if getattr(getattr(module, "quantization_scheme", None), "weights", None) is not None:
            _calibrate_min_max(module, inputs[name])
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=format)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    return out


def _input_ranges(model: Any) -> dict[str, tuple[Any, Any]]:
    """Each Linear's input min and max over one calibration batch, run before any fake quantization
    (the static activation scales of FP8 and NVFP4 come from these, as llmcompressor's calibration does)."""
    import torch

    ranges: dict[str, tuple[Any, Any]] = {}

    def observe(name: str) -> Any:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            ranges[name] = (args[0].float().amin(), args[0].float().amax())
        return hook

    hooks = [m.register_forward_pre_hook(observe(n)) for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        model(torch.randint(0, SIZES["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED)))
    for hook in hooks:
        hook.remove()
    return ranges


def _calibrate_min_max(module: Any, input_range: tuple[Any, Any]) -> None:
    """What llmcompressor's MinMax observers compute for static weights (per the scheme's strategy)
    and static input activations (FP8's input_scale, NVFP4's input_global_scale)."""
    import torch
    from compressed_tensors.quantization import QuantizationStrategy as S
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    activations = module.quantization_scheme.input_activations
    if hasattr(module, "input_global_scale"):
        module.input_global_scale.data.copy_(generate_gparam(*input_range))
    elif hasattr(module, "input_scale") and activations is not None:
        low, high = (value.reshape(1) for value in input_range)
        module.input_scale.data.copy_(calculate_qparams(low, high, activations)[0].reshape(module.input_scale.shape))

    args = module.quantization_scheme.weights
    weight = module.weight.data.float()
    global_scale = None
    if args.strategy == S.TENSOR:
        low, high = weight.amin().reshape(1), weight.amax().reshape(1)
    elif args.strategy == S.CHANNEL:
        low, high = weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
    elif args.strategy in (S.GROUP, S.TENSOR_GROUP):
        grouped = weight.unflatten(-1, (-1, args.group_size))
        low, high = grouped.amin(-1), grouped.amax(-1)
    else:  # BLOCK: zero-padded to whole blocks, as the quantizer pads
        rows, cols = args.block_structure
        padded = torch.nn.functional.pad(weight, (0, -weight.shape[1] % cols, 0, -weight.shape[0] % rows))
        blocks = padded.unflatten(0, (-1, rows)).unflatten(-1, (-1, cols))
        low, high = blocks.amin((1, 3)), blocks.amax((1, 3))
    if args.strategy == S.TENSOR_GROUP:  # NVFP4: FP8 group scales under one FP32 global scale
        global_scale = generate_gparam(weight.amin(), weight.amax())
        module.weight_global_scale.data.copy_(global_scale)
    scale, zero_point = calculate_qparams(low, high, args, global_scale=global_scale)
    module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zero_point.reshape(module.weight_zero_point.shape))


from quant_mlx import MlxUnavailable, write_mlx  # noqa: E402,F401
from quant_plants import (  # noqa: E402,F401
    plant_corrupt_quant_state,
    plant_missing_scale,
    plant_nan_scales,
    plant_truncated_payload,
    plant_wrong_bits,
)
from quant_spec_writers import (  # noqa: E402,F401 - re-exported: one import for every writer
    tiny_gpt_oss,
    write_awq,
    write_bitnet,
    write_eetq,
    write_fbgemm_fp8,
    write_fp8_block,
    write_gptq,
    write_modelopt,
    write_mxfp4,
)
