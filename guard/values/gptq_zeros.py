"""CG208 (``scan --values``): a symmetric GPTQ set's stored zero points against its ``checkpoint_format``.

A symmetric scheme's zero point is the middle of the range, 2^(bits-1) (8 for 4 bits).  ``checkpoint_format``
``gptq`` (v1, AutoGPTQ) stores it minus one (7); ``gptq_v2`` (gptqmodel) stores it as is (8).  Loaders follow
the config (vLLM adds the one back for v1 only), so zero points of the other convention put every weight one
quantization step off (vllm#38966: Qwen3.5-27B-GPTQ-Int4, v2 zero points under ``gptq``).

Read only where the config says GPTQ with ``sym`` (its default) and 2, 4 or 8 bits: the ``qzeros`` of the first
``SAMPLED_MODULES`` modules, at most ``SAMPLED_WORDS`` int32 words each (a few hundred KiB at most).  Asymmetric
zero points say nothing of the convention; mixed values say nothing either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from guard.catalogue import make_finding
from guard.findings import Finding, shown

if TYPE_CHECKING:
    from guard.inventory import ModelInventory

SAMPLED_MODULES = 8
SAMPLED_WORDS = 1 << 14
FORMATS = ("gptq", "gptq_v2")


def gptq_zero_point_findings(inv: ModelInventory, located: Any) -> list[Finding]:
    from guard.inventory.quantization import quantized_modules

    findings: list[Finding] = []
    for ws in inv.sets:
        quant = inv.quantization(ws)
        if quant is None or quant.method != "gptq" or not quant.known:
            continue
        fmt = (quant.format or "gptq").lower()
        bits = quant.bits
        if fmt not in FORMATS or quant.params.get("sym", True) is not True or bits not in (2, 4, 8):
            continue
        zeros = [m.components["zeros"] for m in quantized_modules(inv, ws) if "zeros" in m.components]
        seen: set[int] = set()
        read: list[Any] = []
        for name in zeros[:SAMPLED_MODULES]:
            info = located.get(ws, name)
            if info is None or info.dtype != "I32":
                continue
            seen |= _values(info, bits)
            read.append(info)
            if len(seen) > 1:
                break  # not one value: nothing to say
        if len(seen) != 1 or not read:
            continue
        value = seen.pop()
        v1, v2 = 2 ** (bits - 1) - 1, 2 ** (bits - 1)
        other = "gptq_v2" if fmt == "gptq" and value == v2 else "gptq" if fmt == "gptq_v2" and value == v1 else None
        if other is None:
            continue
        said = f"{'v1, zero - 1' if fmt == 'gptq' else 'v2, the zero itself'}: {v1 if fmt == 'gptq' else v2}"
        findings.append(make_finding(
            "CG208", read[0].file,
            f"{quant.declared_by} says checkpoint_format {shown(fmt, 20)} ({said} for symmetric {bits}-bit), but "
            f"every zero point of {len(read)} module(s) read is {value}, {other}'s convention; e.g. "
            f"{shown(read[0].name)}: every weight is dequantized one step off.  Declare checkpoint_format {other}",
            tensor=read[0].name))
    return findings


def _values(info: Any, bits: int) -> set[int]:
    """The distinct ``bits``-wide fields of the tensor's first ``SAMPLED_WORDS`` little-endian int32 words."""
    import numpy as np

    if info.data_start is None or info.data_end is None:
        return set()
    size = min(info.data_end - info.data_start, SAMPLED_WORDS * 4) // 4 * 4
    with open(info.file, "rb") as fh:
        fh.seek(info.data_start)
        raw = fh.read(size)  # a truncated file gives what is there
    words = np.frombuffer(raw[: len(raw) // 4 * 4], dtype="<u4")
    mask = np.uint32((1 << bits) - 1)
    found: set[int] = set()
    for shift in range(0, 32, bits):
        found.update(int(v) for v in np.unique((words >> np.uint32(shift)) & mask))
    return found
