"""The dtype vocabulary: safetensors' codes (all 22 variants of its Rust enum), then the
codes other formats need that safetensors lacks (ggml block types, ONNX's 2/4-bit integers,
strings, complex128).  ``DTYPES`` stays exactly safetensors' set: its reader refuses anything else.
"""

from __future__ import annotations

from guard.records import Record


class DtypeInfo(Record):
    code: str
    bits: int  # per element; 0 for block-quantized types (see ``block``) and strings
    kind: str  # "float" | "int" | "uint" | "bool" | "complex" | "quantized" | "string"
    torch: str | None  # torch attribute name, None where torch has no such dtype
    numpy: str | None  # numpy / ml_dtypes dtype name
    config: str | None = None  # the name config.json uses (torch_dtype), floats only
    block: tuple[int, int] | None = None  # (elements per block, bytes per block): ggml types


DTYPES: dict[str, DtypeInfo] = {
    "BOOL": DtypeInfo("BOOL", 8, "bool", "bool", "bool"),
    "U8": DtypeInfo("U8", 8, "uint", "uint8", "uint8"),
    "I8": DtypeInfo("I8", 8, "int", "int8", "int8"),
    "I16": DtypeInfo("I16", 16, "int", "int16", "int16"),
    "U16": DtypeInfo("U16", 16, "uint", "uint16", "uint16"),
    "I32": DtypeInfo("I32", 32, "int", "int32", "int32"),
    "U32": DtypeInfo("U32", 32, "uint", "uint32", "uint32"),
    "I64": DtypeInfo("I64", 64, "int", "int64", "int64"),
    "U64": DtypeInfo("U64", 64, "uint", "uint64", "uint64"),
    "F16": DtypeInfo("F16", 16, "float", "float16", "float16", "float16"),
    "BF16": DtypeInfo("BF16", 16, "float", "bfloat16", "bfloat16", "bfloat16"),
    "F32": DtypeInfo("F32", 32, "float", "float32", "float32", "float32"),
    "F64": DtypeInfo("F64", 64, "float", "float64", "float64", "float64"),
    "C64": DtypeInfo("C64", 64, "complex", "complex64", "complex64"),
    "F8_E4M3": DtypeInfo("F8_E4M3", 8, "float", "float8_e4m3fn", "float8_e4m3fn", "float8_e4m3fn"),
    "F8_E5M2": DtypeInfo("F8_E5M2", 8, "float", "float8_e5m2", "float8_e5m2", "float8_e5m2"),
    "F8_E4M3FNUZ": DtypeInfo(
        "F8_E4M3FNUZ", 8, "float", "float8_e4m3fnuz", "float8_e4m3fnuz", "float8_e4m3fnuz"
    ),
    "F8_E5M2FNUZ": DtypeInfo(
        "F8_E5M2FNUZ", 8, "float", "float8_e5m2fnuz", "float8_e5m2fnuz", "float8_e5m2fnuz"
    ),
    "F8_E8M0": DtypeInfo("F8_E8M0", 8, "float", "float8_e8m0fnu", "float8_e8m0fnu", "float8_e8m0fnu"),
    "F6_E2M3": DtypeInfo("F6_E2M3", 6, "float", None, "float6_e2m3fn"),
    "F6_E3M2": DtypeInfo("F6_E3M2", 6, "float", None, "float6_e3m2fn"),
    "F4": DtypeInfo("F4", 4, "float", "float4_e2m1fn_x2", "float4_e2m1fn"),
}

# ggml's block-quantized types: (elements per block, bytes per block), from ggml's type
# traits (the `gguf` package's GGML_QUANT_SIZES, 0.19).  The *_4_4/_4_8/_8_8 types are
# Q4_0/IQ4_NL repacked in 4/8-row interleaves: llama.cpp removed them in late 2024, but
# files with them are on the Hub and their size is still exact.
GGML_BLOCKS: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q8_0": (32, 34), "Q8_1": (32, 40),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
    "Q6_K": (256, 210), "Q8_K": (256, 292),
    "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74), "IQ3_XXS": (256, 98), "IQ1_S": (256, 50),
    "IQ4_NL": (32, 18), "IQ3_S": (256, 110), "IQ2_S": (256, 82), "IQ4_XS": (256, 136),
    "IQ1_M": (256, 56), "TQ1_0": (256, 54), "TQ2_0": (256, 66),
    "MXFP4": (32, 17), "NVFP4": (64, 36), "Q1_0": (128, 18),
    "Q4_0_4_4": (32, 18), "Q4_0_4_8": (32, 18), "Q4_0_8_8": (32, 18),
    "IQ4_NL_4_4": (32, 18), "IQ4_NL_4_8": (32, 18), "IQ4_NL_8_8": (32, 18),
}

# Codes safetensors has no name for.  I4/U4/I2/U2 are ONNX's packed integers (two or four
# per byte); ml_dtypes names them.  STRING has no fixed width.
EXTRA_DTYPES: dict[str, DtypeInfo] = {
    "C128": DtypeInfo("C128", 128, "complex", "complex128", "complex128"),
    "I4": DtypeInfo("I4", 4, "int", None, "int4"),
    "U4": DtypeInfo("U4", 4, "uint", None, "uint4"),
    "I2": DtypeInfo("I2", 2, "int", None, "int2"),
    "U2": DtypeInfo("U2", 2, "uint", None, "uint2"),
    "STRING": DtypeInfo("STRING", 0, "string", None, None),
    "NF4": DtypeInfo("NF4", 4, "quantized", None, None),  # OpenVINO/bitsandbytes 4-bit normal float
    **{code: DtypeInfo(code, 0, "quantized", None, None, block=block) for code, block in GGML_BLOCKS.items()},
}
ALL_DTYPES: dict[str, DtypeInfo] = {**DTYPES, **EXTRA_DTYPES}

# Low-precision codes used by quantized checkpoints (payloads and block scales).
QUANTIZED_CODES = frozenset(
    {"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",
     "I4", "U4", "I2", "U2", "NF4", *GGML_BLOCKS}
)

# Short names users type (--expect, --dtype, config.json values) -> code.
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "F32", "float32": "F32", "float": "F32", "f32": "F32",
    "fp16": "F16", "float16": "F16", "half": "F16", "f16": "F16",
    "bf16": "BF16", "bfloat16": "BF16",
    "fp64": "F64", "float64": "F64", "double": "F64", "f64": "F64",
    "fp8": "F8_E4M3", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
}

# numpy / flax dtype names (dtype.name) -> code; used by the msgpack reader.
NUMPY_NAMES: dict[str, str] = {info.numpy: code for code, info in DTYPES.items() if info.numpy}
NUMPY_NAMES.update({"bool_": "BOOL", "float4_e2m1fn": "F4"})

# torch dtype attribute names -> code; used by the pickle readers.
TORCH_NAMES: dict[str, str] = {info.torch: code for code, info in DTYPES.items() if info.torch}
TORCH_NAMES.update({"float4_e2m1fn_x2": "F4", "half": "F16", "float": "F32", "double": "F64",
                    "long": "I64", "int": "I32", "short": "I16"})


def is_float(code: str) -> bool:
    info = ALL_DTYPES.get(code)
    return info is not None and info.kind == "float"


def is_known(code: str) -> bool:
    return code in ALL_DTYPES


def nbytes(code: str, numel: int) -> int | None:
    """Exact bytes of ``numel`` elements; block types count whole blocks.  None: no fixed width."""
    info = ALL_DTYPES.get(code)
    if info is None or (info.bits == 0 and info.block is None):
        return None
    if info.block is not None:
        elements, size = info.block
        return -(-numel // elements) * size
    return (numel * info.bits + 7) // 8


def parse_dtype_name(name: str) -> str | None:
    """Map a user- or config-facing dtype name to a code; None if unknown."""
    key = name.strip()
    if key.upper() in DTYPES:
        return key.upper()
    key = key.lower().removeprefix("torch.").removeprefix("jnp.").removeprefix("np.")
    return DTYPE_ALIASES.get(key)


def display_name(code: str) -> str:
    """The friendly name for tables: F32 -> fp32, BF16 -> bf16."""
    return {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "F64": "fp64"}.get(code, code)
