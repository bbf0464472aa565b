"""Value checks of quantized sets (``scan --values``): CG205 invalid scales, CG206 saturated FP8 payloads
(and CG208, GPTQ zero points against checkpoint_format, in ``guard.values.gptq_zeros``).

Which scales (components with a scale role, ``guard.inventory.quant_conventions.ROLES``):

- NaN or Inf: always invalid (every weight the scale multiplies becomes NaN/Inf).
- negative: invalid except where the method's scales carry a sign (MLX affine and HQQ store
  ``w = scale * q + bias`` / ``(q - zero) * scale`` from a min/max pair whose order may flip).
- zero: invalid where the scale stands for a whole tensor (one element), is a divisor
  (compressed-tensors' ``weight_global_scale``) or is ModelOpt's second-level ``weight_scale_2``.
  A zero *group* scale is how a quantizer encodes an all-zero group (pruned weights), so it is legal.
- E8M0 scales (MXFP4 ``*_scales``, MLX mxfp4/mxfp8, F8_E8M0): the byte 0xFF is NaN.

Saturated FP8 (CG206): a payload quantized with a scale puts its largest |value| of each scale group
at the format's maximum (448 for E4M3), with perhaps a few neighbours rounding up to it; a payload
cast with no (or too small a) scale is clamped, and every weight past the maximum lands there.  The
threshold: more than ``SATURATED_FRACTION`` (0.5%) of the payload's values at ±max AND more than
``SATURATED_PER_GROUP`` (4) of them per scale group.  The second term keeps small groups (MLX
mxfp8's 32) legal; a properly scaled payload never passes both.  FP8 payloads are read once more
for this (a count of two byte values per chunk), in bounded chunks.

Packed payloads stored under a float dtype (bitsandbytes' ``bnb_4bit_quant_storage`` bf16/fp32) are left
out of the value scan altogether (``packed_under_float``): their bit patterns are nibbles, not numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from guard.catalogue import make_finding
from guard.findings import Finding, shown

if TYPE_CHECKING:
    from guard.inventory import ModelInventory
    from guard.tensors import TensorInfo

SCALE_ROLES = frozenset({"scales", "scale_2", "global_scale", "absmax", "nested_absmax", "SCB"})
SIGNED_SCALES = frozenset({"mlx", "hqq"})  # methods whose scales may be negative
WHOLE_TENSOR_ROLES = frozenset({"scale_2", "global_scale"})  # zero is never legal for these
# formats whose U8 scales are E8M0 exponents: MLX modes, compressed-tensors' MX formats
E8M0_FORMATS = frozenset({"mxfp4", "mxfp8", "mxfp4-pack-quantized", "mxfp8-quantized"})
FP8_CODES = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
SATURATED_FRACTION = 0.005
SATURATED_PER_GROUP = 4
CHUNK_ELEMENTS = 1 << 20
QUANT_STATE_LIMIT = 1 << 16  # bitsandbytes' record is a few hundred bytes
PACKED_FLOAT_STORAGE = frozenset({"BF16", "F16", "F32", "F64"})


def quantized_value_findings(inv: ModelInventory) -> list[Finding]:
    """CG205/CG206 for every quantized set of ``inv`` (nothing for a model without quantization)."""
    from guard.inventory.quantization import quantized_modules

    sets = [ws for ws in inv.sets if inv.quantization(ws) is not None]
    if not sets:
        return []
    located = _Located(inv)
    findings: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for ws in sets:
        quant = inv.quantization(ws)
        assert quant is not None
        for module in quantized_modules(inv, ws):
            method = module.method or quant.method
            scale_count = 1
            for role, name in module.components.items():
                if role not in SCALE_ROLES:
                    continue
                info = located.get(ws, name)
                if info is None or (info.file, name) in seen:
                    continue
                seen.add((info.file, name))
                if role == "scales":
                    scale_count = max(1, info.numel or 1)
                findings.extend(_scale_findings(info, role, method, module.format or quant.format))
            state = module.components.get("quant_state")
            if state is not None and (located_state := located.get(ws, state)) is not None:
                findings.extend(_quant_state_findings(module, located_state))
            payload = located.get(ws, module.payload)
            if payload is not None and payload.dtype in FP8_CODES and (payload.file, payload.name) not in seen:
                seen.add((payload.file, payload.name))
                findings.extend(_saturation_findings(payload, scale_count))
        if quant.method == "low-precision":  # FP8 tensors with no scale at all (the inventory's word): one group each
            for info in ws.tensors:
                if info.dtype in FP8_CODES and (info.file, info.name) not in seen:
                    seen.add((info.file, info.name))
                    located_info = located.get(ws, info.name)
                    if located_info is not None:
                        findings.extend(_saturation_findings(located_info, 1))
    from guard.values.gptq_zeros import gptq_zero_point_findings  # CG208: qzeros against checkpoint_format

    findings.extend(gptq_zero_point_findings(inv, located))
    return findings


def packed_under_float(inv: ModelInventory) -> set[tuple[str, str]]:
    """(file, name) of quantized payloads whose stored dtype is a 16- or 32-bit float: bitsandbytes 4-bit with
    ``bnb_4bit_quant_storage`` bf16/fp16/fp32 keeps its packed bytes under that dtype, so NaN/Inf/range checks
    on them would report bit patterns, not values.  No method stores real payload values that wide (FP8
    payloads are F8_*), so the dtype alone says "packed"."""
    if not any(inv.quantization(ws) is not None for ws in inv.sets):
        return set()
    from guard.inventory.quantization import quantized_modules

    out: set[tuple[str, str]] = set()
    for ws in inv.sets:
        if inv.quantization(ws) is None:
            continue
        payloads = {m.payload for m in quantized_modules(inv, ws)}
        out.update((t.file, t.name) for t in ws.tensors if t.name in payloads and t.dtype in PACKED_FLOAT_STORAGE)
    return out


def _quant_state_findings(module: Any, info: TensorInfo) -> list[Finding]:
    """bitsandbytes' quant_state blob is data: JSON with the logical shape and block size.  A blob that
    does not parse loses the module (CG110); one that declares no 4-bit layout mismatches it (CG111)."""
    from guard.convert.read.dequant import DequantError
    from guard.convert.read.dequant.bnb import quant_state

    if info.data_start is None or info.data_end is None or info.data_end - info.data_start > QUANT_STATE_LIMIT:
        return []
    blob = b"".join(chunk.tobytes() for chunk in _chunks(info._replace(dtype="U8")))
    try:
        quant_state(module, _BlobReader({info.name: blob}))
    except DequantError as exc:
        return [make_finding(exc.code, info.file, f"{shown(exc.tensor)}: {exc.message}", tensor=exc.tensor)]
    return []


class _BlobReader:
    """The one-tensor ``read`` a dequantizer's record parser takes."""

    def __init__(self, blobs: dict[str, bytes]) -> None:
        self.blobs = blobs

    def __call__(self, name: str) -> Any:
        import numpy as np

        return np.frombuffer(self.blobs[name], dtype=np.uint8)


def _scale_findings(info: TensorInfo, role: str, method: str, fmt: str | None) -> list[Finding]:
    import numpy as np

    e8m0 = info.dtype == "F8_E8M0" or (info.dtype == "U8" and role == "scales" and (
        method == "mxfp4" or (fmt or "").lower() in E8M0_FORMATS or method == "compressed-tensors"))
    if e8m0:
        bad = sum(int(np.count_nonzero(chunk.view(np.uint8) == 0xFF)) for chunk in _chunks(info))
        if bad:
            return [make_finding("CG205", info.file, f"{bad:,} E8M0 scale byte(s) of {shown(info.name)} are 0xFF "
                                 f"(NaN): every weight they scale dequantizes to NaN", tensor=info.name)]
        return []
    if not _is_float(info.dtype):
        return []  # bnb double-quant absmax codes (U8) and the like: not values
    from guard.values.minifloats import to_float32

    nan = inf = negative = zero = 0
    for chunk in _chunks(info):
        values = to_float32(info.dtype, chunk)
        nan += int(np.count_nonzero(np.isnan(values)))
        inf += int(np.count_nonzero(np.isinf(values)))
        negative += int(np.count_nonzero(values < 0))
        zero += int(np.count_nonzero(values == 0))
    problems = []
    if nan or inf:
        problems.append(f"{nan:,} NaN and {inf:,} Inf")
    if negative and method not in SIGNED_SCALES:
        problems.append(f"{negative:,} negative")
    if zero and (role in WHOLE_TENSOR_ROLES or (info.numel or 0) == 1):
        problems.append("zero" if (info.numel or 0) == 1 else f"{zero:,} zero")
    if not problems:
        return []
    return [make_finding("CG205", info.file, f"{method} scale {shown(info.name)} {info.dtype}{list(info.shape)} holds "
                         f"{' and '.join(problems)} value(s), which the scheme forbids", tensor=info.name)]


def _saturation_findings(info: TensorInfo, groups: int) -> list[Finding]:
    import numpy as np

    from guard.values.minifloats import largest, largest_bits

    top = largest_bits(info.dtype)
    at_max = sum(int(np.count_nonzero((chunk.view(np.uint8) & 0x7F) == (top & 0x7F))) for chunk in _chunks(info))
    numel = info.numel or 0
    if not numel or at_max <= SATURATED_FRACTION * numel or at_max <= SATURATED_PER_GROUP * groups:
        return []
    limit = largest(info.dtype)
    return [make_finding("CG206", info.file, f"{at_max:,} of {numel:,} values ({at_max / numel:.1%}) of "
                         f"{shown(info.name)} {info.dtype} sit at ±{limit:g}, the format's maximum, with {groups:,} "
                         "scale group(s): a cast with no scaling clipped them", tensor=info.name)]


def _is_float(code: str) -> bool:
    from guard import dtypes

    return dtypes.is_float(code) and code not in ("F4", "F6_E2M3", "F6_E3M2")


def _chunks(info: TensorInfo) -> Iterator[Any]:
    """The tensor's elements as unsigned bits (``minifloats.to_float32`` gives their values) in chunks of
    CHUNK_ELEMENTS (a truncated file yields what is there)."""
    import numpy as np

    from guard.values.minifloats import BITS_VIEW, itemsize

    if info.data_start is None or info.data_end is None:
        return
    dtype = np.dtype(np.uint8) if info.dtype == "U8" else np.dtype(BITS_VIEW[itemsize(info.dtype)])
    total = (info.data_end - info.data_start) // dtype.itemsize
    with open(info.file, "rb") as fh:
        for start in range(0, total, CHUNK_ELEMENTS):
            count = min(CHUNK_ELEMENTS, total - start)
            fh.seek(info.data_start + start * dtype.itemsize)
            raw = fh.read(count * dtype.itemsize)
            if len(raw) < dtype.itemsize:
                return
            yield np.frombuffer(raw[: len(raw) // dtype.itemsize * dtype.itemsize], dtype=dtype)


class _Located:
    """A set's tensors by name with their bytes placed (torch zips scanned headers-only are re-read once)."""

    def __init__(self, inv: ModelInventory) -> None:
        self.inv = inv
        self.by_file: dict[str, dict[str, TensorInfo]] | None = None

    def get(self, ws: Any, name: str) -> TensorInfo | None:
        info = _index(ws).get(name)
        if info is None or info.data_start is not None:
            return info
        if self.by_file is None:
            self.by_file = {}
        if info.file not in self.by_file:
            self.by_file[info.file] = {t.name: t for t in _relocated(info.file)}
        return self.by_file[info.file].get(name, info)


def _relocated(path: str) -> Sequence[TensorInfo]:
    """A torch zip's tensors with their bytes placed (a headers-only scan leaves them unplaced)."""
    from guard.readers import READ_FAILURES
    from guard.readers.torch.zip import read_torch_zip
    from guard.sources import LocalFile

    try:
        with LocalFile(path, name=path) as source:
            return read_torch_zip(source, locate_data=True).tensors
    except (OSError,) + READ_FAILURES:
        return ()  # not placed: the tensors are skipped, as the value scan skips them


def _index(ws: Any) -> dict[str, TensorInfo]:
    cached = ws.memo.get("values: tensors by name")
    if cached is None:
        cached = ws.memo["values: tensors by name"] = {t.name: t for t in ws.tensors}
    return cached
