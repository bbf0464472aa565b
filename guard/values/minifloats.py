"""bf16 and the fp8 formats from their bit patterns, with numpy integer views only (no ml_dtypes).

A value scan reads these formats' raw bits and only rarely needs their values: importing ml_dtypes
for that cost more than the work (0.75 s for ml_dtypes 0.7.0 against ~0.15 s for a 1.5 GB scan's
arithmetic).  So each format is described by its bit fields, and:

- ``to_float32`` decodes stored bits: bf16 is the top half of an fp32 (a shift), an 8-bit format is
  a 256-entry table of fp32 bit patterns built from its fields;
- ``cast_back`` rounds float32/float64 values to a format's grid and returns them in their own
  dtype: what ``values.astype(fmt).astype(values.dtype)`` gives with ml_dtypes, which rounds to
  nearest even, gives inf on overflow where the format has one and NaN where it has none, and casts
  float64 through float32 first (so a float64 value is rounded twice, as there).

Equal to ml_dtypes on every bit pattern of bf16, fp16 and the fp8 formats, and on random fp32
patterns (tests/test_values_minifloats.py).  The caller imports numpy; this module needs nothing else
but ``guard.records``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from guard.records import Record


class Format(Record):
    exponent: int  # exponent bits
    mantissa: int  # stored mantissa bits
    bias: int
    kind: str  # "ieee": top exponent is inf/NaN; "fn": no inf, all-ones is NaN; "fnuz": 0x80 is NaN; "e8m0"


FORMATS: dict[str, Format] = {
    "BF16": Format(8, 7, 127, "ieee"),
    "F8_E4M3": Format(4, 3, 7, "fn"),
    "F8_E5M2": Format(5, 2, 15, "ieee"),
    "F8_E4M3FNUZ": Format(4, 3, 8, "fnuz"),
    "F8_E5M2FNUZ": Format(5, 2, 16, "fnuz"),
    "F8_E8M0": Format(8, 0, 127, "e8m0"),  # unsigned powers of two: scales, never a cast target
}
NATIVE: dict[str, type[np.floating[Any]]] = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
BITS_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def itemsize(code: str) -> int:
    return int(np.dtype(NATIVE[code]).itemsize) if code in NATIVE else (2 if code == "BF16" else 1)


def smallest_normal(code: str) -> float:
    if code in NATIVE:
        return float(np.finfo(NATIVE[code]).smallest_normal)
    fmt = FORMATS[code]
    return 2.0 ** ((0 if fmt.kind == "e8m0" else 1) - fmt.bias)  # E8M0 has no subnormals: 0x00 is normal


def largest(code: str) -> float:
    """The largest finite value (``finfo(...).max``)."""
    if code in NATIVE:
        return float(np.finfo(NATIVE[code]).max)
    fmt = FORMATS[code]
    top_exponent = (1 << fmt.exponent) - 1
    mantissa = (1 << fmt.mantissa) - 1
    if fmt.kind == "ieee":
        top_exponent -= 1  # the all-ones exponent holds inf and NaN
    elif fmt.kind == "fn":
        mantissa -= 1  # all ones is NaN
    elif fmt.kind == "e8m0":
        top_exponent -= 1  # 0xFF is NaN
    return (1 + mantissa / (1 << fmt.mantissa)) * 2.0 ** (top_exponent - fmt.bias)


def largest_bits(code: str) -> int:
    """The bit pattern of ``+largest(code)`` in an 8-bit format."""
    table = float32_table(code).view(np.float32)
    return int(np.flatnonzero(table == np.float32(largest(code)))[0])


@cache
def float32_table(code: str) -> Any:
    """Each of an 8-bit format's 256 patterns as fp32 bits (uint32): its value, exactly."""
    fmt = FORMATS[code]
    byte = np.arange(256, dtype=np.int64)
    signed = fmt.kind != "e8m0"
    sign = np.where(signed & (byte >= 128), -1.0, 1.0)
    field = byte & 0x7F if signed else byte
    exponent, mantissa = field >> fmt.mantissa, field & ((1 << fmt.mantissa) - 1)
    scale = 1 << fmt.mantissa
    value = np.where(exponent == 0, np.ldexp(mantissa / scale, 1 - fmt.bias),  # subnormals
                     np.ldexp(1 + mantissa / scale, exponent - fmt.bias)) * sign
    if fmt.kind == "e8m0":
        value = np.ldexp(1.0, byte - fmt.bias)
    top = (1 << fmt.exponent) - 1
    if fmt.kind == "ieee":
        value = np.where(exponent == top, np.where(mantissa == 0, sign * np.inf, np.nan), value)
    elif fmt.kind == "fn":
        value = np.where(field == 0x7F, np.nan, value)
    elif fmt.kind == "fnuz":
        value = np.where(byte == 0x80, np.nan, value)
    else:
        value = np.where(byte == 0xFF, np.nan, value)
    with np.errstate(under="ignore"):  # 2^-127 (E8M0's 0x00) is an fp32 subnormal, exactly
        return value.astype(np.float32).view(np.uint32)


def to_float32(code: str, bits: Any) -> Any:
    """Stored bits (an unsigned integer array of the format's width) as float32 values, exactly."""
    if code == "BF16":
        return np.left_shift(bits.astype(np.uint32), 16).view(np.float32)
    if code in NATIVE:
        return bits.view(NATIVE[code]).astype(np.float32)
    return float32_table(code).take(bits).view(np.float32)


def cast_back(values: Any, code: str) -> Any:
    """``values`` (float32 or float64) cast to ``code`` and back to their own dtype."""
    if code in NATIVE:
        return values.astype(NATIVE[code]).astype(values.dtype)
    with np.errstate(over="ignore"):  # ml_dtypes goes through float32: a float64 past its range is inf
        narrow = values.astype(np.float32) if values.dtype != np.float32 else values
    out = _round_bf16(narrow) if code == "BF16" else _round(narrow, code)
    return out.astype(values.dtype) if out.dtype != values.dtype else out


def _round_bf16(values: Any) -> Any:
    """Round to nearest even on the 16 bits dropped (bf16 has fp32's exponent: subnormals and the carry
    into inf come out right); NaNs stay NaN."""
    bits = values.view(np.uint32)
    out = np.right_shift(bits, np.uint32(16))  # one array, worked in place: this runs on every value for CG204
    np.bitwise_and(out, np.uint32(1), out=out)
    np.add(out, np.uint32(0x7FFF), out=out)
    np.add(out, bits, out=out)
    np.bitwise_and(out, np.uint32(0xFFFF0000), out=out)
    rounded = out.view(np.float32)
    nan = np.isnan(values)
    if nan.any():
        np.copyto(rounded, values, where=nan)
    return rounded


def _round(values: Any, code: str) -> Any:
    """Round to nearest even at the format's precision (clamped at its subnormal step), then
    non-finite past its largest value."""
    fmt = FORMATS[code]
    _fraction, exponent = np.frexp(values)
    step = np.maximum(exponent - 1, 1 - fmt.bias) - fmt.mantissa  # the format's quantum, as a power of two
    with np.errstate(invalid="ignore", over="ignore"):  # the carry out of float32's top binade is inf
        rounded = np.ldexp(np.rint(np.ldexp(values, -step)), step)
        past = ~(np.abs(rounded) <= np.float32(largest(code)))
    if past.any():
        overflow = np.copysign(np.float32(np.inf), rounded) if fmt.kind == "ieee" else np.float32(np.nan)
        rounded = np.where(past & ~np.isnan(rounded), overflow, rounded)
    if fmt.kind == "fnuz":
        rounded = rounded + np.float32(0)  # no negative zero in these formats: -0 + 0 is +0
    return rounded
