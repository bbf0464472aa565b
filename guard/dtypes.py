"""The dtype vocabulary: safetensors' codes (all 22 variants of its Rust enum)."""

from __future__ import annotations

from guard.records import record



@record
class DtypeInfo:
    code: str
    bits: int
    kind: str  # "float" | "int" | "uint" | "bool" | "complex"
    torch: str | None  # torch attribute name, None where torch has no such dtype
    numpy: str | None  # numpy / ml_dtypes dtype name
    config: str | None = None  # the name config.json uses (torch_dtype), floats only


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

# Low-precision codes used by quantized checkpoints (payloads and block scales).
QUANTIZED_CODES = frozenset(
    {"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"}
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
    info = DTYPES.get(code)
    return info is not None and info.kind == "float"


def nbytes(code: str, numel: int) -> int | None:
    info = DTYPES.get(code)
    if info is None:
        return None
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
