"""CG111's arithmetic: what one module's payload and components must measure, layout by layout.

Each check derives the logical input width from the payload and the module's bits, then asks
the scales (and zeros, g_idx, absmax) to cover it in groups of the declared size, as the
method's own loader would index them.  A truncated payload or a config with the wrong bits
shows as a disagreement here.  Returns a sentence naming the shapes, or None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from itertools import compress

from guard.inventory.quant_modules import Kind, QuantModule
from guard.tensors import TENSOR_SHAPE, TensorInfo

Check = Callable[[QuantModule, TensorInfo, Mapping[str, TensorInfo]], "str | None"]


def kind_shape_problems(kind: Kind) -> Iterator[tuple[str, str, str]]:
    """(prefix, payload, problem) for each module of one kind whose shapes disagree.  The modules of a kind share
    all a check reads but their shapes (suffixes, dtypes, bits, group size, layout), and most share those with many
    others (every layer's q_proj): each distinct set of shapes is checked once, on its first module."""
    check = CHECKS.get(kind.plan.layout.name) if kind.plan.layout is not None else None
    if check is None:
        return
    count = len(kind.prefixes)
    if kind.plan.scheme is None:  # bits or group size per module (MLX, quanto): each module on its own
        for i in range(count):
            module = kind.module(i)
            problem = check(module, kind.payload(i), kind.components(i))
            if problem is not None:
                yield module.prefix, module.payload, problem
        return
    columns = [map(TENSOR_SHAPE, column) for column in kind.columns.values()]  # every module of a kind has these parts
    keys = list(zip(*columns)) if len(columns) > 1 else list(columns[0])
    first = dict(zip(reversed(keys), range(count - 1, -1, -1)))  # each distinct key -> its first module, in C
    bad: dict[object, str] = {}
    for key, i in first.items():
        problem = check(kind.module(i), kind.payload(i), kind.components(i))
        if problem is not None:
            bad[key] = problem
    if bad:
        for i in compress(range(count), map(bad.__contains__, keys)):
            yield kind.prefixes[i], kind.payload(i).name, bad[keys[i]]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _groups(width: int, group: int | None) -> int:
    return 1 if not group or group <= 0 else _ceil(width, group)


def _per_word(module: QuantModule) -> int | None:
    return 32 // module.bits if module.bits and 32 % module.bits == 0 else None


def _gptq(module: QuantModule, payload: TensorInfo, parts: Mapping[str, TensorInfo]) -> str | None:
    per = _per_word(module)
    if per is None or len(payload.shape) != 2:
        return None
    rows, out = payload.shape
    width = rows * per
    scales, zeros, g_idx = parts.get("scales"), parts.get("zeros"), parts.get("g_idx")
    if g_idx is not None and g_idx.shape != (width,):
        return (f"qweight {list(payload.shape)} holds {width} input rows at {module.bits} bits, but g_idx has "
                f"{list(g_idx.shape)}")
    if scales is not None and (len(scales.shape) != 2 or scales.shape[1] != out):
        return f"qweight {list(payload.shape)} has {out} output columns, scales {list(scales.shape)}"
    if scales is not None and g_idx is None and scales.shape[0] != _groups(width, module.group_size):
        return (f"qweight {list(payload.shape)} holds {width} input rows at {module.bits} bits: "
                f"{_groups(width, module.group_size)} group(s) of {module.group_size}, "
                f"but scales has {scales.shape[0]}")
    if zeros is not None and scales is not None and zeros.shape != (scales.shape[0], _ceil(out, per)):
        return f"qzeros {list(zeros.shape)} does not pack scales {list(scales.shape)} at {module.bits} bits"
    return None


def _awq(module: QuantModule, payload: TensorInfo, parts: Mapping[str, TensorInfo]) -> str | None:
    per = _per_word(module)
    if per is None or len(payload.shape) != 2:
        return None
    width, cols = payload.shape
    out = cols * per
    scales, zeros = parts.get("scales"), parts.get("zeros")
    if scales is not None and scales.shape != (_groups(width, module.group_size), out):
        return (f"qweight {list(payload.shape)} is {width} inputs × {out} outputs at {module.bits} bits, so scales "
                f"should be {[_groups(width, module.group_size), out]}, not {list(scales.shape)}")
    if zeros is not None and scales is not None and zeros.shape != (scales.shape[0], cols):
        return f"qzeros {list(zeros.shape)} does not pack scales {list(scales.shape)} at {module.bits} bits"
    return None


def _row_groups(module: QuantModule, payload: TensorInfo, parts: Mapping[str, TensorInfo]) -> str | None:
    """Scales [out, in/g] beside a payload [out, packed in]: compressed-tensors, MLX, ModelOpt NVFP4."""
    if module.logical_shape is None or len(payload.shape) != 2:
        return None
    out, width = module.logical_shape
    scales = parts.get("scales")
    if scales is None or len(scales.shape) != 2 or scales.shape[1] == 1:
        return None  # per-channel (or per-tensor) scales: any width fits
    group = module.group_size or (16 if "nvfp4" in module.layout else None)
    if group is None:
        return None
    # padding in the last word
    slack = (32 // module.bits - 1) if module.bits and payload.dtype in ("I32", "U32") else 0
    fits = {_groups(w, group) for w in range(max(1, width - slack), width + 1)}
    if scales.shape[0] != out or scales.shape[1] not in fits:
        return (f"payload {list(payload.shape)} holds {out} × {width} values at {module.bits} bits: scales should be "
                f"[{out}, {_groups(width, group)}] for groups of {group}, not {list(scales.shape)}")
    for role in ("biases", "zeros"):
        other = parts.get(role)
        # compressed-tensors packs asymmetric zero points along the output rows, as the weights along the inputs
        packed_rows = _ceil(scales.shape[0], 32 // module.bits) if other is not None and other.dtype == "I32" \
            and module.bits and 32 % module.bits == 0 else scales.shape[0]
        if other is not None and len(other.shape) == 2 and other.shape != (packed_rows, scales.shape[1]):
            return f"{role} {list(other.shape)} does not match scales {list(scales.shape)}"
    return None


def _bnb4(module: QuantModule, payload: TensorInfo, parts: Mapping[str, TensorInfo]) -> str | None:
    blob = parts.get("quant_state")
    if blob is not None and (blob.dtype != "U8" or len(blob.shape) != 1 or not blob.numel):
        # bitsandbytes packs the quant state's JSON into a 1-D uint8 tensor (QuantState.as_dict(packed=True))
        return f"quant_state is {blob.dtype} {list(blob.shape)}, not the 1-D U8 JSON blob bitsandbytes writes"
    absmax = parts.get("absmax")
    if absmax is None or not absmax.numel:
        return None
    count = payload.numel * payload_bits(payload) // 4
    size = _ceil(count, absmax.numel)
    if _ceil(count, size) != absmax.numel or size not in _BNB_BLOCKS:
        return (f"{count} packed 4-bit values over {absmax.numel} absmax block(s) is {size} a block; bitsandbytes "
                "writes blocks of 64 to 4096 (a truncated payload?)")
    return None


# Params4bit's blocksize: 64 by default (transformers never sets another), 128 on older ROCm builds; bitsandbytes
# takes up to 4096.  32 is left out on purpose: a payload cut in half over 64-value blocks would read as 32.
_BNB_BLOCKS = frozenset({64, 128, 256, 512, 1024, 2048, 4096})


def payload_bits(tensor: TensorInfo) -> int:
    from guard import dtypes

    info = dtypes.ALL_DTYPES.get(tensor.dtype)
    return info.bits if info is not None and info.bits else 8


def _bnb8(module: QuantModule, payload: TensorInfo, parts: Mapping[str, TensorInfo]) -> str | None:
    scb = parts.get("SCB")
    if scb is not None and payload.shape and scb.shape != payload.shape[:1]:
        return f"weight {list(payload.shape)} has {payload.shape[0]} rows, SCB {list(scb.shape)}"
    return None


def _hqq(module: QuantModule, payload: TensorInfo, parts: Mapping[str, TensorInfo]) -> str | None:
    scale, zero = parts.get("scales"), parts.get("zeros")
    if scale is not None and zero is not None and scale.numel != zero.numel:
        return f"scale {list(scale.shape)} and zero {list(zero.shape)} differ"
    if scale is None or not module.bits or not module.group_size or not payload.shape:
        return None
    count = scale.numel * module.group_size
    per = payload_bits(payload) // module.bits  # values a stored element holds (3-bit: 10 in an int32)
    capacity = payload.numel * per
    if capacity < count or capacity - count >= payload.shape[-1] * per:  # padding never reaches a whole row
        return (f"scale {list(scale.shape)} covers {count} values in groups of {module.group_size}, but W_q "
                f"{list(payload.shape)} ({payload.dtype}) holds {capacity} at {module.bits} bits")
    return None


def _fp8_block(module: QuantModule, payload: TensorInfo, parts: Mapping[str, TensorInfo]) -> str | None:
    scales = parts.get("scales")
    block = module_block(module)
    if scales is None or len(payload.shape) != 2 or block is None or len(scales.shape) != 2:
        return None
    want = (_ceil(payload.shape[0], block[0]), _ceil(payload.shape[1], block[1]))
    if scales.shape != want:
        return (f"weight {list(payload.shape)} in blocks of {list(block)} needs weight_scale_inv {list(want)}, not "
                f"{list(scales.shape)}")
    return None


def module_block(module: QuantModule) -> tuple[int, int] | None:
    return None if module.group_size is None else (module.group_size, module.group_size)


def _mxfp4(module: QuantModule, payload: TensorInfo, parts: Mapping[str, TensorInfo]) -> str | None:
    scales = parts.get("scales")
    if len(payload.shape) < 2 or payload.shape[-1] != 16:
        return f"_blocks {list(payload.shape)} should end in 16 bytes a block (32 FP4 values)"
    if scales is not None and scales.shape != payload.shape[:-1]:
        return f"_blocks {list(payload.shape)} needs _scales {list(payload.shape[:-1])}, not {list(scales.shape)}"
    return None


def _per_row(module: QuantModule, payload: TensorInfo, parts: Mapping[str, TensorInfo]) -> str | None:
    scales = parts.get("scales")
    if scales is None or not payload.shape or not scales.shape or scales.numel == 1:
        return None
    group = module.group_size
    if group and len(payload.shape) == 2 and scales.shape in (
            (_ceil(payload.shape[0], group), _ceil(payload.shape[1], group)),  # block scales (FP8_BLOCK)
            (payload.shape[0], _ceil(payload.shape[1], group))):  # group scales
        return None
    if scales.shape[0] != payload.shape[0] and len(scales.shape) <= 2 and len(payload.shape) == 2:
        if module.layout == "quanto-qbytes" or scales.shape[-1] == 1:
            return f"weight {list(payload.shape)} has {payload.shape[0]} rows, its scales {list(scales.shape)}"
    return None


CHECKS: dict[str, Check] = {
    "gptq": _gptq, "awq": _awq, "pack-quantized": _row_groups, "nvfp4-pack-quantized": _row_groups,
    "mlx-affine": _row_groups, "mlx-fp4": _row_groups, "modelopt-nvfp4": _row_groups,
    "bnb-4bit": _bnb4, "bnb-8bit": _bnb8, "hqq": _hqq, "fp8-block": _fp8_block, "mxfp4": _mxfp4,
    "quanto-qbytes": _per_row, "fbgemm-fp8": _per_row, "float-quantized": _per_row,
}
