"""Quantization of a weight set: how the model says it is quantized, and which tensors are its components.

Read from config.json's ``quantization_config`` (or MLX's ``quantization`` record, or the copy
mlx-lm writes without a ``quant_method``), from ``quanto_qmap.json`` / an old
``quantize_config.json`` beside the weights, from a reader's word in the file, or, with none
of those, from the tensor names alone (``guard.inventory.quant_conventions.FINGERPRINTS``).
The modules themselves are grouped in ``guard.inventory.quant_modules`` (only for quantized sets).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import chain, compress, repeat
from math import prod
from types import MappingProxyType

from guard import dtypes
from guard.inventory.quant_conventions import (
    FINGERPRINTS,
    METHOD_ALIASES,
    QUANT_CONFIG_FILES,
    QUANTO_BITS,
    UNQUANTIZED_KEYS,
)
from guard.records import Record
from guard.tensors import TENSOR_DTYPE, TENSOR_NAME, TENSOR_SHAPE, column, select

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the hook's path (a scan imports none)
if TYPE_CHECKING:  # guard.inventory.model imports this module: no import back
    from typing import Any as ModelInventory  # not the class: even a type-only import back is one (test_architecture)

    from typing_extensions import Never  # typing's from 3.11

    from guard.inventory.quant_modules import QuantModule
    from guard.inventory.sets import WeightSet
    from guard.tensors import TensorInfo

__all__ = ["Quantization", "QuantModule", "bits_per_weight", "component_roles", "logical_by_dtype",
           "logical_parameters", "packed_label", "quantized_modules", "set_quantization"]

_EMPTY: Mapping[str, Never] = MappingProxyType({})  # no value: a default for a mapping of any value type


class Quantization(Record):
    method: str  # the table's method ("bitsandbytes", "gptq", ...), or a quant_method it does not know, as written
    bits: int | None = None
    group_size: int | None = None
    format: str | None = None  # nf4 / int8 / gemm / pack-quantized / affine / qint4 / NVFP4 / a GGUF file's types
    unquantized: tuple[str, ...] = ()  # modules the config keeps unquantized
    declared_by: str = "config.json quantization_config"
    params: Mapping[str, object] = _EMPTY  # the raw record as read
    known: bool = True  # False: the table does not know this method; reported quantized, never judged by dtype rules

    @property
    def label(self) -> str:
        """"bitsandbytes nf4 4-bit", "mlx affine 4-bit g64", "gguf Q8_0"."""
        parts = [self.method]
        if self.format and self.format != self.method:
            parts.append(self.format)
        if self.bits:
            parts.append(f"{self.bits}-bit")
        if self.group_size:
            parts.append(f"g{self.group_size}")
        return " ".join(parts)

    @property
    def note(self) -> str:
        """What the report says beside the label: a method the table does not know is not judged."""
        return "" if self.known else "method not recognised: its tensors are not judged by the dtype rules"

    def to_json(self) -> dict[str, object]:
        return {"method": self.method, "bits": self.bits, "group_size": self.group_size, "format": self.format,
                "unquantized": list(self.unquantized), "declared_by": self.declared_by, "known": self.known}

    @classmethod
    def from_json(cls, obj: object) -> Quantization | None:
        """The record, or a version-2 report's string ("bitsandbytes", "Q8_0") as the method it named."""
        if obj is None:
            return None
        if isinstance(obj, str):
            return cls(obj, declared_by="report")
        if not isinstance(obj, dict):
            raise ValueError(f"quantization is neither a record nor a string: {obj!r}"[:200])
        return cls(str(obj.get("method", "quantized")), _int(obj.get("bits")), _int(obj.get("group_size")),
                   None if obj.get("format") is None else str(obj["format"]),
                   tuple(str(m) for m in obj.get("unquantized") or ()), str(obj.get("declared_by", "report")),
                   _EMPTY, bool(obj.get("known", True)))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ------------------------------------------------------------------ what the model says


def declared_quantization(config: object, quant_files: Mapping[str, object]) -> Quantization | None:
    """From config.json, then the files beside it (quanto_qmap.json, quantize_config.json, quant_config.json)."""
    if isinstance(config, dict):
        qc = config.get("quantization_config")
        mlx = config.get("quantization")
        if isinstance(qc, dict) and qc.get("quant_method") is not None:
            return _from_quant_method(qc)
        if isinstance(mlx, dict) and ("bits" in mlx or "group_size" in mlx):
            return _from_mlx(mlx, "config.json quantization")
        if isinstance(qc, dict) and ("bits" in qc or "group_size" in qc):
            return _from_mlx(qc, "config.json quantization_config")  # mlx-lm's copy, no quant_method
        if isinstance(qc, dict) and qc:
            return Quantization("quantized", declared_by="config.json quantization_config", params=qc, known=False)
    for name in sorted(quant_files):
        record_ = quant_files[name]
        method = QUANT_CONFIG_FILES.get(name)
        if method == "quanto" and isinstance(record_, dict):
            return _from_qmap(record_)
        if method in ("gptq", "awq") and isinstance(record_, dict):
            found = _from_quant_method({"quant_method": method, **record_})
            return found._replace(declared_by=name)
        if method == "modelopt" and isinstance(record_, dict) and isinstance(record_.get("quantization"), dict):
            found = _from_quant_method({"quant_method": method, **record_["quantization"]})
            return found._replace(declared_by=name)
    return None


def _from_quant_method(qc: dict[str, object]) -> Quantization:
    raw = str(qc.get("quant_method"))
    method = METHOD_ALIASES.get(raw.lower())
    unquantized = _unquantized(qc)
    if method is None:
        bits = _int(qc.get("bits")) or _int(qc.get("w_bit")) or _int(qc.get("num_bits"))
        return Quantization(raw[:80], bits, _int(qc.get("group_size")), None, unquantized, params=qc, known=False)
    bits, group, fmt = _int(qc.get("bits")), _int(qc.get("group_size")), None
    if method == "bitsandbytes":
        four = bool(qc.get("load_in_4bit") or qc.get("_load_in_4bit"))
        bits, fmt = (4, str(qc.get("bnb_4bit_quant_type", "fp4"))) if four else (8, "int8")
    elif method == "gptq":
        fmt = str(qc.get("checkpoint_format") or qc.get("format") or "gptq")
    elif method == "awq":
        bits = bits or _int(qc.get("w_bit"))
        group = group or _int(qc.get("q_group_size"))
        fmt = str(qc.get("version", "gemm")).lower()
    elif method == "hqq":
        weight = qc.get("quant_config", {})
        weight = weight.get("weight_quant_params", weight) if isinstance(weight, dict) else {}
        if isinstance(weight, dict):
            bits, group = _int(weight.get("nbits")) or bits, _int(weight.get("group_size")) or group
    elif method == "quanto":
        fmt = str(qc.get("weights", "int8"))
        bits = QUANTO_BITS.get("q" + fmt, QUANTO_BITS.get(fmt))
    elif method == "compressed-tensors":
        bits, group, fmt = _compressed_tensors(qc)
    elif method in ("fp8", "fbgemm_fp8", "eetq"):
        bits, fmt = 8, "e4m3" if method != "eetq" else "int8"
        block = qc.get("weight_block_size")
        if isinstance(block, list) and len(block) == 2 and block[0] == block[1]:
            group = _int(block[0])  # DeepSeek's [128, 128]: square blocks, one size
    elif method == "mxfp4":
        bits, group, fmt = 4, 32, "mxfp4"
    elif method == "bitnet":
        bits = 2
    elif method == "modelopt":
        nested = qc.get("quantization")
        if not isinstance(nested, dict):
            nested = qc
        fmt = str(nested.get("quant_algo") or "FP8")
        bits = 4 if "FP4" in fmt.upper() else 8
        group = _int(nested.get("group_size")) or (16 if bits == 4 else None)
    elif method == "torchao":
        quant_type = qc.get("quant_type")
        fmt = str(quant_type.get("default", {}).get("_type", "")) if isinstance(quant_type, dict) and isinstance(
            quant_type.get("default"), dict) else str(quant_type)[:60] if quant_type else None
        lowered = (fmt or "").lower()
        bits = 4 if "int4" in lowered else 8 if ("int8" in lowered or "float8" in lowered) else bits
    return Quantization(method, bits, group, fmt, unquantized, params=qc)


def _compressed_tensors(qc: dict[str, object]) -> tuple[int | None, int | None, str | None]:
    fmt = qc.get("format")
    bits = group = None
    groups = qc.get("config_groups")
    for scheme in groups.values() if isinstance(groups, dict) else ():
        weights = scheme.get("weights") if isinstance(scheme, dict) else None
        if isinstance(weights, dict):
            bits, group = _int(weights.get("num_bits")), _int(weights.get("group_size"))
            block = weights.get("block_structure")
            if group is None and isinstance(block, list) and len(block) == 2 and block[0] == block[1]:
                group = _int(block[0])  # FP8_BLOCK: square blocks, one size
            fmt = fmt if isinstance(fmt, str) and fmt != "mixed-precision" else scheme.get("format") or fmt
            break
    sparsity = qc.get("sparsity_config")
    if fmt is None and isinstance(sparsity, dict):
        fmt = sparsity.get("format")
    return bits, group, str(fmt) if fmt is not None else None


def _from_mlx(record_: dict[str, object], where: str) -> Quantization:
    skipped = tuple(k for k, v in record_.items() if v is False)
    return Quantization("mlx", _int(record_.get("bits")), _int(record_.get("group_size")),
                        str(record_.get("mode", "affine")), skipped, where, record_)


def _from_qmap(qmap: dict[str, object]) -> Quantization:
    kinds = [str(v.get("weights")) for v in qmap.values()
             if isinstance(v, dict) and v.get("weights") not in (None, "none")]
    fmt = max(set(kinds), key=kinds.count) if kinds else None
    return Quantization("quanto", QUANTO_BITS.get(fmt or ""), None, fmt, (), "quanto_qmap.json", qmap)


def _unquantized(qc: dict[str, object]) -> tuple[str, ...]:
    names: list[str] = []
    for key in UNQUANTIZED_KEYS:
        value = qc.get(key)
        if isinstance(value, list):
            names.extend(str(v)[:200] for v in value if isinstance(v, str))
    return tuple(dict.fromkeys(names))


# ------------------------------------------------------------------ what the tensors say


def set_quantization(inv: ModelInventory, ws: WeightSet | None) -> Quantization | None:
    """The set's quantization (once per set): the model's declaration for its HF-format weights, else the
    files' own word, else the tensor names, else low-precision dtypes (GGUF block types, F8, ONNX int4)."""
    if ws is None:
        return declared_quantization(inv.config, inv.quant_files)
    if "quantization" in ws.memo:
        return ws.memo["quantization"]
    found = None
    if ws.primary or ws.format in ("safetensors", "torch"):
        found = declared_quantization(inv.config, inv.quant_files)
    if found is None:
        word = next((s.metadata["quantization"] for s in ws.files if "quantization" in s.metadata), None)
        found = Quantization(str(word)[:80], declared_by="file metadata") if word else None
    if found is None:
        found = _from_tensor_names(ws)
    if found is None:
        low = ws.quantized_codes()
        if low:
            method = "gguf" if all(s.format == "gguf" for s in ws.files) else "low-precision"
            found = Quantization(method, format="+".join(dtypes.display_name(c) for c in low),
                                 declared_by="tensor dtypes")
    ws.memo["quantization"] = found
    return found


_PACKED_CODES = frozenset({"U8", "I8", "I32", "U32", "I16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
_LAST_PARTS = frozenset(s.rpartition(".")[2] for s in FINGERPRINTS if "." in s)
_ENDINGS = (*sorted(_LAST_PARTS), "_blocks")  # every name the loop below acts on ends with one of these


def _name_candidates(ws: WeightSet, known: Mapping[str, str]) -> Iterator[TensorInfo]:
    """``ws.tensors`` whose names end with a fingerprint's last part or ``_blocks``, in the set's order:
    picked by ``str.endswith`` in C (a pipeline commit's 4,800 tensors, a sharded index's 200,000),
    so the Python loop runs only for the few that can be components; those in ``known`` left out first."""
    if known:
        from guard.inventory.quant_modules import unroled_tensors  # known: the set is quantized

        left = unroled_tensors(ws, known)
        return compress(left, map(str.endswith, map(TENSOR_NAME, left), repeat(_ENDINGS)))
    if ws.layout == "lightning":  # ``tensors`` leaves training state out
        return (t for t in ws.tensors if t.name.endswith(_ENDINGS))
    return chain.from_iterable(
        select(scan.tensors, map(str.endswith, column(TENSOR_NAME, scan.tensors), repeat(_ENDINGS)))
        for scan in ws.files)



def _from_tensor_names(ws: WeightSet, *, known: Mapping[str, str] = _EMPTY) -> Quantization | None:
    """A method's distinctive tensor names (one set lookup per tensor); MLX's ``biases`` only beside U32 weights.
    ``known``: tensors already read as components of the declared method, passed over."""
    if not (ws.by_dtype().keys() & _PACKED_CODES):
        return None  # every method packs into integers or fp8 somewhere (a bnb quant_state blob at least)
    seen: dict[str, str] = {}
    for tensor in _name_candidates(ws, known):
        name = tensor.name
        last = name[name.rfind(".") + 1:]
        if last in _LAST_PARTS:
            cut = len(name)
            for _ in range(3):  # ".SCB", ".weight.absmax", ".weight._data._data"
                cut = name.rfind(".", 0, cut)
                if cut < 0:
                    break
                method = FINGERPRINTS.get(name[cut:])
                if method is not None:
                    seen.setdefault(method, name)
        elif last.endswith("_blocks") and tensor.dtype == "U8":
            seen.setdefault("mxfp4", name)
    if "mlx" in seen and "U32" not in ws.by_dtype():
        del seen["mlx"]
    if not seen:
        return None
    method = next(iter(seen))
    fmt = None
    if method == "bitsandbytes":
        fmt = "int8" if any(n.endswith(".SCB") for n in seen.values()) and len(seen) == 1 else None
    bits = 8 if fmt == "int8" or method in ("fp8", "eetq") else 4 if method == "mxfp4" else None
    return Quantization(method, bits, None, fmt, (), "tensor names",
                        MappingProxyType({"example": seen[method]}))


# ------------------------------------------------------------------ the modules (guard.inventory.quant_modules)


def quantized_modules(inv: ModelInventory, ws: WeightSet) -> tuple[QuantModule, ...]:
    from guard.inventory.quant_modules import grouped

    return grouped(inv, ws).modules


def component_roles(inv: ModelInventory, ws: WeightSet) -> dict[str, str]:
    """Tensor name -> "payload" or a component role, for every tensor that is part of quantization."""
    if inv.quantization(ws) is None:
        return {}
    from guard.inventory.quant_modules import grouped

    return grouped(inv, ws).roles


def logical_parameters(inv: ModelInventory, ws: WeightSet) -> int:
    """What num_parameters() of the full-precision model counts: floating tensors that are not components,
    plus each quantized module's logical count."""
    if inv.quantization(ws) is None:
        return sum(n for code, n in ws.parameters_by_dtype().items() if dtypes.is_float(code))
    from guard.inventory.quant_modules import grouped

    return grouped(inv, ws).logical


def packed_label(quant: Quantization) -> str:
    """The share label of a quantized set's packed weights: "nf4 (packed)", "gptq (packed)", "qint4 (packed)"."""
    fmt = quant.format if quant.format and len(quant.format) <= 24 else quant.method
    return f"{fmt[:24]} (packed)"


def logical_by_dtype(inv: ModelInventory, ws: WeightSet) -> dict[str, int]:
    """The set's logical parameters by label, summing to ``logical_parameters``: each unquantized floating
    tensor under its dtype code, the packed payloads' logical weights under ``packed_label``, components
    (scales, zeros, absmax, quant maps, g_idx, ...) nowhere.  Unquantized sets: floating elements by dtype."""
    quant = inv.quantization(ws)
    by_code = ws.parameters_by_dtype()
    if quant is None:
        return {code: n for code, n in by_code.items() if dtypes.is_float(code)}
    from guard.inventory.quant_modules import BY_DTYPES

    roles = component_roles(inv, ws)
    left = dict(by_code)
    if roles:  # what the components leave of each dtype: the elements of its tensors not in ``roles``, in C
        from guard.inventory.quant_modules import unroled_tensors

        rest = unroled_tensors(ws, roles)
        for code in left:
            left[code] = sum(map(prod, map(TENSOR_SHAPE, compress(rest, map(code.__eq__, map(TENSOR_DTYPE, rest)))))) \
                if rest else 0
    every = quant.declared_by in BY_DTYPES  # GGUF blocks, NNCF: the stored elements are the logical ones
    shares = {code: n for code, n in left.items() if n > 0 and (every or dtypes.is_float(code))}
    packed = logical_parameters(inv, ws) - sum(shares.values())
    if packed > 0:
        shares[packed_label(quant)] = packed
    return shares


def bits_per_weight(inv: ModelInventory, ws: WeightSet) -> float | None:
    """Stored bits of the whole set over its logical parameters (as mlx-lm prints it: 4.51 for its 4-bit)."""
    if inv.quantization(ws) is None:
        return None
    logical = logical_parameters(inv, ws)
    stored = sum(stats.bytes for stats in ws.dtype_summary().values())  # the scan's sums: no walk of the tensors
    return round(stored * 8 / logical, 2) if logical else None


def __getattr__(name: str) -> object:  # QuantModule lives with the grouping; importable from here too
    if name == "QuantModule":
        from guard.inventory.quant_modules import QuantModule

        return QuantModule
    raise AttributeError(name)
