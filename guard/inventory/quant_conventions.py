"""Quantization conventions: one literal table, method -> how it is declared and how it stores a module.

Every row is a layout a real library writes (bitsandbytes, AutoGPTQ/gptqmodel, AutoAWQ, hqq,
optimum-quanto, compressed-tensors, DeepSeek/Qwen FP8, FBGEMM, NVIDIA ModelOpt, gpt-oss MXFP4,
mlx-lm, EETQ, BitNet), as observed in files they wrote or read from their loaders (see
docs/quantized.md).  A module is a prefix; its tensors are the prefix plus a suffix below.  The
rules and the report read this table; they never test names themselves ("scale" in a name misses
HQQ's ``zero`` and bnb's ``absmax``, and catches ordinary ``layer_scale`` weights).

Packing: a payload holds ``storage bits / bits`` logical elements per stored element, whatever
its stored dtype (bnb 4-bit may store its bytes under a float dtype), so the logical count of a
module is ``payload bits / bits``; ``shape`` says how the logical weight's shape follows from the
payload's, where headers can tell.
"""

from __future__ import annotations

from guard.records import Record


class Part(Record):
    suffix: str  # after the module prefix: ".qweight", ".weight.absmax", "_blocks"
    role: str  # "payload" or a component role (ROLES)
    need: str = "required"  # "required" | "asymmetric" (zero points: a symmetric scheme has none) | "optional"


class Layout(Record):
    """How one method (one of its formats) stores one quantized module."""

    method: str
    name: str  # the layout's own name, shown in findings
    parts: tuple[Part, ...]
    packed: frozenset[str]  # payload dtypes that alone say "packed" under this method (evidence without companions)
    weight: str  # suffix of the dequantized weight's name
    bits: int | None = None  # fixed by the layout (bnb 4-bit, MXFP4, NVFP4); None: from the config
    # the logical weight's shape from the payload's (None: headers cannot tell, the count still can):
    # "same", "cols" (last dim × packing), "rows" (first dim × packing, then [in, out] -> [out, in]: GPTQ),
    # "awq" (cols × packing, then transposed), "bitnet" (first dim × packing),
    # "mxfp4" ([E, rows, G, 16] -> [E, G·32, rows])
    shape: str | None = "same"
    # how many logical values: "payload" (its bits over the module's bits; one a stored element where the shape
    # is "same"), "groups" (scales × group size: HQQ's 3-bit packing leaves padding in its int32 words), or
    # "bitmask" (one bit a logical value: the sparse formats)
    count: str = "payload"  # type: ignore[assignment]  # a field named count shadows tuple.count, as namedtuple allows
    one_of: tuple[str, ...] = ()  # roles of which one must be there (bnb's quant_state: __nf4 or __fp4)

    @property
    def payload(self) -> Part:
        return next(p for p in self.parts if p.role == "payload")


# Component roles, as the table names them (QuantModule.components keys; HQQ's metadata tensors are "meta:<name>").
ROLES = ("scales", "zeros", "biases", "absmax", "quant_map", "nested_absmax", "nested_quant_map", "quant_state",
         "g_idx", "SCB", "weight_format", "global_scale", "input_scale", "output_scale", "input_global_scale",
         "input_zero_point", "weight_shape", "scale_2", "kv_scale", "bitmask", "row_offsets", "meta")

_P, _R, _A, _O = "payload", "required", "asymmetric", "optional"
# HQQ's HQQLinear.state_dict(): the packed weight, its scale and zero, and its meta record as tensors (hqq 0.2.8)
_HQQ_META = ("shape", "nbits", "group_size", "axis", "packing", "unpack_view_dtype", "view_as_float", "channel_wise",
             "optimize", "round_zero", "encoded_state_dict", "stores_quant_config", "compute_dtype", "offload_meta",
             "quant_scale", "quant_zero")
_FP8 = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
_KV = (Part(".k_scale", "kv_scale", _O), Part(".v_scale", "kv_scale", _O))  # FP8 KV-cache scales on attention

LAYOUTS: tuple[Layout, ...] = (
    # bitsandbytes Params4bit: packed bytes [n/2, 1] under bnb_4bit_quant_storage (U8, or a float dtype)
    Layout("bitsandbytes", "bnb-4bit", (
        Part(".weight", _P), Part(".weight.absmax", "absmax"), Part(".weight.quant_map", "quant_map"),
        Part(".weight.nested_absmax", "nested_absmax", _O), Part(".weight.nested_quant_map", "nested_quant_map", _O),
        Part(".weight.quant_state.bitsandbytes__nf4", "quant_state", _O),
        Part(".weight.quant_state.bitsandbytes__fp4", "quant_state", _O)),
        frozenset(), ".weight", bits=4, shape=None, one_of=("quant_state",)),
    # bitsandbytes Int8Params: row-wise int8 with SCB (one fp32 scale per row)
    Layout("bitsandbytes", "bnb-8bit",
           (Part(".weight", _P), Part(".SCB", "SCB"), Part(".weight_format", "weight_format", _O)),
           frozenset(), ".weight", bits=8),
    # AutoGPTQ / gptqmodel QuantLinear: qweight [in·bits/32, out], v1 stores zero points minus one
    Layout("gptq", "gptq", (Part(".qweight", _P), Part(".qzeros", "zeros"), Part(".scales", "scales"),
                            Part(".g_idx", "g_idx", _O)), frozenset({"I32"}), ".weight", shape="rows"),
    # AutoAWQ WQLinear_GEMM: qweight [in, out·bits/32] in AWQ's nibble order
    Layout("awq", "awq", (Part(".qweight", _P), Part(".qzeros", "zeros"), Part(".scales", "scales")),
           frozenset({"I32"}), ".weight", shape="awq"),
    Layout("hqq", "hqq", (Part(".W_q", _P), Part(".scale", "scales"), Part(".zero", "zeros"),
                          *(Part("." + m, "meta:" + m, _O) for m in _HQQ_META)), frozenset({"U8", "I32"}), ".weight",
           shape=None, count="groups"),
    # optimum-quanto WeightQBytesTensor (int8, float8) and WeightQBitsTensor (int4, int2: packed bytes, regrouped)
    Layout("quanto", "quanto-qbits", (Part(".weight._data._data", _P), Part(".weight._scale", "scales"),
                                      Part(".weight._shift", "zeros"), Part(".input_scale", "input_scale", _O),
                                      Part(".output_scale", "output_scale", _O)), frozenset({"U8"}), ".weight",
           shape=None),
    Layout("quanto", "quanto-qbytes", (Part(".weight._data", _P), Part(".weight._scale", "scales"),
                                       Part(".input_scale", "input_scale", _O),
                                       Part(".output_scale", "output_scale", _O)),
           frozenset({"I8", *_FP8}), ".weight"),
    # compressed-tensors: pack-quantized (int4/int8 in I32), nvfp4-pack-quantized (FP4 pairs in U8)
    Layout("compressed-tensors", "pack-quantized", (
        Part(".weight_packed", _P), Part(".weight_scale", "scales"), Part(".weight_zero_point", "zeros", _A),
        Part(".weight_shape", "weight_shape", _O), Part(".weight_g_idx", "g_idx", _O),
        Part(".input_scale", "input_scale", _O), Part(".input_zero_point", "input_zero_point", _O)),
        frozenset({"I32"}), ".weight", shape="cols"),
    Layout("compressed-tensors", "nvfp4-pack-quantized", (
        Part(".weight_packed", _P), Part(".weight_scale", "scales"), Part(".weight_global_scale", "global_scale"),
        Part(".input_global_scale", "input_global_scale", _O)), frozenset({"U8"}), ".weight", bits=4, shape="cols"),
    # compressed-tensors float-/int-/naive-quantized, and the sparse formats' quantized weights: the payload keeps
    # its name and shape
    Layout("compressed-tensors", "float-quantized", (
        Part(".weight", _P), Part(".weight_scale", "scales"), Part(".weight_zero_point", "zeros", _A),
        Part(".input_scale", "input_scale", _O), Part(".input_zero_point", "input_zero_point", _O),
        Part(".weight_g_idx", "g_idx", _O), *_KV), frozenset({"I8", *_FP8}), ".weight"),
    # compressed-tensors' sparse formats (sparse-bitmask, sparse-24-bitmask, with or without quantized values): the
    # kept values, a bitmask over the logical weight (one bit a value), its shape
    Layout("compressed-tensors", "sparse-bitmask", (
        Part(".weight.compressed", _P), Part(".weight.bitmask", "bitmask"), Part(".weight.shape", "weight_shape", _O),
        Part(".weight.row_offsets", "row_offsets", _O), Part(".weight_scale", "scales", _O),
        Part(".weight_zero_point", "zeros", _O), Part(".input_scale", "input_scale", _O)),
        frozenset(), ".weight", shape=None, count="bitmask"),
    # DeepSeek-V3/R1, Qwen3-FP8: 128×128 block scales, stored inverted
    Layout("fp8", "fp8-block", (Part(".weight", _P), Part(".weight_scale_inv", "scales"),
                                Part(".input_scale", "input_scale", _O), *_KV), _FP8, ".weight", bits=8),
    Layout("fbgemm_fp8", "fbgemm-fp8", (Part(".weight", _P), Part(".weight_scale", "scales"),
                                        Part(".input_scale_ub", "input_scale", _O)), _FP8, ".weight", bits=8),
    # NVIDIA ModelOpt: FP8 per tensor; NVFP4 packed pairs with FP8 block scales and a second-level fp32 scale
    Layout("modelopt", "modelopt-nvfp4", (
        Part(".weight", _P), Part(".weight_scale", "scales"), Part(".weight_scale_2", "scale_2"),
        Part(".input_scale", "input_scale", _O), *_KV), frozenset({"U8"}), ".weight", bits=4, shape="cols"),
    Layout("modelopt", "modelopt-fp8", (Part(".weight", _P), Part(".weight_scale", "scales"),
                                        Part(".input_scale", "input_scale", _O), *_KV), _FP8, ".weight", bits=8),
    # gpt-oss: MoE experts in MXFP4 blocks of 32 (16 bytes) with E8M0 scales (bias 127)
    Layout("mxfp4", "mxfp4", (Part("_blocks", _P), Part("_scales", "scales")), frozenset({"U8"}), "", bits=4,
           shape="mxfp4"),
    # mlx-lm: affine with scales and biases, mxfp4/nvfp4 with scales only; embeddings and lm_head too
    Layout("mlx", "mlx-affine", (Part(".weight", _P), Part(".scales", "scales"), Part(".biases", "biases")),
           frozenset({"U32"}), ".weight", shape="cols"),
    Layout("mlx", "mlx-fp4", (Part(".weight", _P), Part(".scales", "scales")), frozenset({"U32"}), ".weight",
           shape="cols"),
    # torchao's safetensors (torchao.prototype.safetensors): each subclass's tensor data as "_weight_<name>",
    # the subclass record in the header's metadata
    Layout("torchao", "torchao-safetensors", (
        Part("._weight_qdata", _P), Part("._weight_scale", "scales"), Part("._weight_zero_point", "zeros", _O)),
        frozenset({"F8_E4M3", "F8_E5M2", "I8", "U8", "I32"}), ".weight", shape=None),
    Layout("eetq", "eetq", (Part(".weight", _P), Part(".weight_scales", "scales")), frozenset({"I8"}), ".weight",
           bits=8),
    # transformers BitNet: 4 ternary values a byte, packed along the output rows
    Layout("bitnet", "bitnet", (Part(".weight", _P), Part(".weight_scale", "scales")), frozenset({"U8"}), ".weight",
           bits=2, shape="bitnet"),
)

LAYOUTS_BY_METHOD: dict[str, tuple[Layout, ...]] = {}
for _layout in LAYOUTS:
    LAYOUTS_BY_METHOD[_layout.method] = (*LAYOUTS_BY_METHOD.get(_layout.method, ()), _layout)

# Which of a method's layouts a declared format selects (the others stay out: one module, one reading).
FORMAT_LAYOUTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("bitsandbytes", "int8"): ("bnb-8bit",), ("bitsandbytes", "nf4"): ("bnb-4bit",),
    ("bitsandbytes", "fp4"): ("bnb-4bit",),
    ("mlx", "affine"): ("mlx-affine",), ("mlx", "mxfp4"): ("mlx-fp4",), ("mlx", "nvfp4"): ("mlx-fp4",),
    ("mlx", "mxfp8"): ("mlx-fp4",),
    ("modelopt", "FP8"): ("modelopt-fp8",), ("modelopt", "NVFP4"): ("modelopt-nvfp4",),
}

# Where a model says it is quantized, besides config.json (read with it, beside the weights).
QUANT_CONFIG_FILES = {"quanto_qmap.json": "quanto", "quantize_config.json": "gptq", "quant_config.json": "awq",
                      "hf_quant_config.json": "modelopt"}  # ModelOpt's export: {"producer", "quantization"}

# Tensor-name suffixes that alone identify a method (no config at all).  The method's own distinctive names
# only: ``.weight`` + ``.weight_scale`` could be four methods, and is named by its dtypes (see quantization.py).
FINGERPRINTS: dict[str, str] = {
    ".weight.absmax": "bitsandbytes", ".weight.quant_map": "bitsandbytes", ".SCB": "bitsandbytes",
    ".qweight": "gptq", ".W_q": "hqq", ".weight._data": "quanto", ".weight._data._data": "quanto",
    ".weight._scale": "quanto", ".weight_packed": "compressed-tensors", ".weight_scale_inv": "fp8",
    "_blocks": "mxfp4", ".weight_scales": "eetq", ".biases": "mlx", ".weight_scale_2": "modelopt",
    "._weight_qdata": "torchao",
}

# quant_method spellings seen on the Hub -> the table's method.
METHOD_ALIASES = {"bitsandbytes": "bitsandbytes", "bnb": "bitsandbytes", "gptq": "gptq", "awq": "awq",
                  "hqq": "hqq", "quanto": "quanto", "optimum-quanto": "quanto",
                  "compressed-tensors": "compressed-tensors", "compressed_tensors": "compressed-tensors",
                  "fp8": "fp8", "fbgemm_fp8": "fbgemm_fp8", "modelopt": "modelopt", "mxfp4": "mxfp4",
                  "mlx": "mlx", "torchao": "torchao", "eetq": "eetq", "bitnet": "bitnet"}

# Quantization a reader sees in the file (FileScan.metadata["quantization"]) -> its scale constants, by the last
# "/" part of their names: NNCF's weight compression names them "<weight>/scale" and "<weight>/zero_point".
READER_COMPONENTS: dict[str, dict[str, str]] = {"nncf": {"/scale": "scales", "/zero_point": "zeros"}}

# optimum-quanto qtype names -> bits
QUANTO_BITS = {"qint2": 2, "qint4": 4, "qint8": 8, "qfloat8": 8, "qfloat8_e4m3fn": 8, "qfloat8_e5m2": 8,
               "qfloat8_e4m3fnuz": 8}

# Config keys listing the modules a method keeps unquantized.
UNQUANTIZED_KEYS = ("modules_to_not_convert", "llm_int8_skip_modules", "skip_modules", "ignore", "exclude_modules",
                    "modules_to_not_quantize")
