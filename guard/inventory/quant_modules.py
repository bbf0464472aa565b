"""The quantized modules of one set: its tensors grouped by prefix in one pass, each group read by the table.

Every tensor is looked up by its last few name parts in a dict built from the active layouts
(``guard.inventory.quant_conventions``), so a quantized set costs the same per tensor as any
other.  A prefix is a quantized module when its payload is there and something says it is
packed: a payload name only the method uses (``qweight``, ``W_q``), a component beside it, or
a payload dtype the method packs into (MLX's U32).  Imported only for sets that are quantized.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping
from fnmatch import fnmatchcase
from itertools import chain, compress
from math import prod
from operator import itemgetter

from guard import dtypes
from guard.inventory.quant_conventions import (
    FORMAT_LAYOUTS,
    LAYOUTS,
    LAYOUTS_BY_METHOD,
    QUANTO_BITS,
    READER_COMPONENTS,
    Layout,
    Part,
)
from guard.inventory.sets import WeightSet
from guard.records import record
from guard.tensors import TensorInfo

TYPE_CHECKING = False
if TYPE_CHECKING:  # the inventory and its Quantization import this module (inside functions): no import back
    from typing import Any as ModelInventory
    from typing import Any as Quantization

BY_DTYPES = frozenset({"tensor dtypes", "file metadata"})  # quantized by dtype or a reader's word: no layout
_GENERIC = frozenset({".weight", ""})  # payload names every model has: evidence must come from elsewhere
_LOOSE_ROLES = frozenset({"input_scale", "output_scale", "kv_scale"})  # alone on a module: activation scales


_PAYLOADS: dict[str, Part] = {layout.name: layout.payload for layout in LAYOUTS}
# layout -> suffix -> the role roles() reports ("meta:shape" reads "meta")
_ROLE_OF: dict[str, dict[str, str]] = {layout.name: {p.suffix: p.role.partition(":")[0] for p in layout.parts}
                                       for layout in LAYOUTS}
# layout -> suffix -> the component's key in QuantModule.components (every suffix of a layout has its own role,
# HQQ's metadata as "meta:<name>"; bnb's two quant_state spellings are one role, and one is ever written)
_COMPONENT_OF: dict[str, dict[str, str]] = {layout.name: {p.suffix: p.role for p in layout.parts if p.role != "payload"}
                                            for layout in LAYOUTS}
# layout -> (suffix, role, need) of the components it cannot load without (zero points: asymmetric schemes only)
_NEEDED: dict[str, tuple[tuple[str, str, str], ...]] = {
    layout.name: tuple((p.suffix, p.role, p.need) for p in layout.parts if p.need in ("required", "asymmetric")
                       and p.role != "payload") for layout in LAYOUTS}
_FLOATS = frozenset(code for code in dtypes.ALL_DTYPES if dtypes.is_float(code))


@record
class QuantModule:
    prefix: str
    method: str
    payload: str  # tensor name of the packed weight
    weight: str  # the name the dequantized weight gets
    components: Mapping[str, str]  # role -> tensor name
    logical_shape: tuple[int, ...] | None
    bits: int | None = None
    group_size: int | None = None
    format: str | None = None
    layout: str = ""  # the table's layout name (bnb-4bit, gptq, mlx-affine, ...)
    missing: tuple[str, ...] = ()  # required component roles not found (CG110)


@record
class Grouped:
    modules: tuple[QuantModule, ...]
    roles: dict[str, str]  # tensor name -> role
    logical: int  # the set's logical parameter count
    stray: tuple[str, ...]  # component names with no module (a payload missing: CG110)
    fallback: bool = False  # nothing was packed the declared way: read by every layout (CG112 says so)
    # each module's payload and components (role -> tensor), in ``modules``' order: CG111's shapes without a look-up
    # by name (empty: look them up)
    tensors: tuple[tuple[TensorInfo, dict[str, TensorInfo]], ...] = ()


def active_layouts(quant: Quantization) -> tuple[Layout, ...]:
    """The layouts a declaration selects; every layout where the method is unknown or read from names alone."""
    chosen = LAYOUTS_BY_METHOD.get(quant.method)
    if chosen is None or not quant.known:
        return LAYOUTS
    names = FORMAT_LAYOUTS.get((quant.method, quant.format or ""))
    return tuple(lay for lay in chosen if lay.name in names) if names else chosen


def grouped(inv: ModelInventory, ws: WeightSet) -> Grouped:
    cached = ws.memo.get("quant modules")
    if cached is None:
        quant = inv.quantization(ws)
        if quant is None:
            cached = Grouped((), {}, 0, ())
        elif quant.declared_by in BY_DTYPES:  # GGUF blocks, NNCF, Core ML: stored elements are logical ones
            cached = _by_reader(ws, READER_COMPONENTS.get(quant.method, {}))
        else:
            # one burst of acyclic records (a module, its components, its parts): the collector would walk every
            # tensor of the set again and again while it runs, and find nothing (see guard.cli.main)
            collecting = gc.isenabled()
            gc.disable()
            try:
                cached = _group(ws, quant)
            finally:
                if collecting:
                    gc.enable()
        ws.memo["quant modules"] = cached
    return cached  # type: ignore[return-value]


def _group(ws: WeightSet, quant: Quantization) -> Grouped:
    layouts = active_layouts(quant)
    index: dict[str, list[tuple[Layout, Part]]] = {}
    for layout in layouts:
        for part in layout.parts:
            index.setdefault(part.suffix, []).append((layout, part))
    prefixes: dict[str, dict[str, TensorInfo]] = {}
    every = chain.from_iterable(scan.tensors for scan in ws.files) if ws.layout != "lightning" else ws.tensors
    if all(s.startswith(".") and s.count(".") == 1 for s in index):
        # every suffix is one name part (GPTQ, AWQ, MLX, ...): the last part names it, the rest is the prefix
        single = {s[1:]: s for s in index}.get
        known = prefixes.get
        for tensor in every:
            prefix, _, last = tensor[0].rpartition(".")
            suffix = single(last)
            if suffix is not None and prefix:
                parts_ = known(prefix)
                if parts_ is None:
                    prefixes[prefix] = {suffix: tensor}
                else:
                    parts_[suffix] = tensor
    else:
        # last name part -> the suffixes ending in it, longest first: one dict lookup a tensor, then a few endswith
        by_last: dict[str, list[str]] = {}
        for suffix in sorted(index, key=len, reverse=True):
            last = suffix.rpartition(".")[2] if suffix.startswith(".") else suffix.rpartition("_")[2]
            by_last.setdefault(last if suffix.startswith(".") else "_" + last, []).append(suffix)
        underscored = any(s.startswith("_") for s in index)
        lookup = by_last.get
        for tensor in every:
            name = tensor.name
            candidates = lookup(name[name.rfind(".") + 1:])
            if candidates is None and underscored:
                candidates = lookup(name[name.rfind("_"):])
            if candidates is not None:
                for suffix in candidates:
                    if name.endswith(suffix) and len(name) > len(suffix):
                        prefixes.setdefault(name[:len(name) - len(suffix)], {})[suffix] = tensor
    modules: list[QuantModule] = []
    roles: dict[str, str] = {}
    stray: list[str] = []
    logical = 0
    component_floats = 0  # the floating elements that are components, not parameters
    strict = quant.known and quant.method in LAYOUTS_BY_METHOD
    symmetric = _symmetric(quant)
    # what a module's suffixes and dtypes decide (its layout, roles, components, missing roles, which parts are
    # floats), worked out once for each such signature: most modules of a set share a few
    plans: dict[tuple[tuple[str, ...], tuple[str, ...]], _Plan] = {}
    found: list[tuple[TensorInfo, dict[str, TensorInfo]]] = []
    roled: list[Iterable[TensorInfo]] = []  # each module's tensors that have a role, and their roles: ``roles``
    role_lists: list[Iterable[str]] = []  # is built from them at the end, in the same order, in C
    for prefix, parts in prefixes.items():
        key = (tuple(parts), tuple(map(_DTYPE, parts.values())))
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = _plan(layouts, index, parts, quant, strict=strict, symmetric=symmetric)
        (layout, role_names, floats_mask, comp_keys, comp_get, missing, scheme, role_of, stray_mask, method,
         payload_suffix, factor, count) = plan
        tensors = parts.values()
        if role_names is not None:
            roled.append(tensors)
            role_lists.append(role_names)
        else:
            kept = [(tensor, role_of[suffix]) for suffix, tensor in parts.items() if suffix in role_of]
            roled.append([tensor for tensor, _ in kept])
            role_lists.append([role for _, role in kept])
        if floats_mask is not None:
            if len(floats_mask) == 1:
                component_floats += prod(parts[floats_mask[0]][2])
            else:
                component_floats += sum(map(prod, map(_SHAPE, map(parts.__getitem__, floats_mask))))
        if layout is None:
            if stray_mask is not None:
                stray.extend(map(_NAME, compress(tensors, stray_mask)))
            continue
        payload = parts[payload_suffix]
        components = comp_get(parts)
        found.append((payload, dict(zip(comp_keys, components))))
        if scheme is not None:  # the common case: bits, group size and format the same for every module
            bits, group, fmt = scheme
            module = QuantModule(prefix, method, payload.name, prefix + layout.weight,
                                 dict(zip(comp_keys, map(_NAME, components))),
                                 _shape_of(layout.shape, payload.shape, factor), bits, group, fmt, layout.name,
                                 missing)
        else:
            bits, group, fmt = _module_scheme(prefix, layout, quant, parts)
            module = QuantModule(prefix, method, payload.name, prefix + layout.weight,
                                 dict(zip(comp_keys, map(_NAME, components))),
                                 _logical_shape(layout, payload, bits), bits, group, fmt, layout.name, missing)
        modules.append(module)
        if count is not None:  # _logical_count's "payload" arithmetic, its factors worked out once
            logical += prod(payload.shape) * count[0] // count[1]
        else:
            logical += _logical_count(layout, parts, module)
    roles.update(zip(map(_NAME, chain.from_iterable(roled)), chain.from_iterable(role_lists)))
    if strict and not modules and quant.method in LAYOUTS_BY_METHOD and layouts is not LAYOUTS:
        # nothing packed the declared way: read the tensors by every layout, so the count stays logical
        # (CG112 says the declaration is wrong)
        return _group(ws, quant._replace(known=False, bits=None, group_size=None))._replace(fallback=True)
    floats = sum(n for code, n in ws.parameters_by_dtype().items() if dtypes.is_float(code))
    logical += floats - component_floats
    # by prefix (each module's own: no two are equal, so the triples never compare further)
    ordered = sorted(zip(map(_NAME, modules), modules, found))
    return Grouped(tuple(map(_SECOND, ordered)), roles, logical, tuple(sorted(stray)), False,
                   tuple(map(_THIRD, ordered)))


_NAME, _DTYPE, _SHAPE = itemgetter(0), itemgetter(1), itemgetter(2)  # TensorInfo's fields (records are tuples)
_SECOND, _THIRD = itemgetter(1), itemgetter(2)


@record
class _Plan:
    layout: Layout | None
    role_names: tuple[str, ...] | None  # each part's role, in the parts' order (None: some part has none)
    floats: tuple[str, ...] | None  # the suffixes of the floating components, in the parts' order (None: none)
    comp_keys: tuple[str, ...]  # QuantModule.components' keys, in the parts' order
    comp_get: Callable[[Mapping[str, TensorInfo]], tuple[TensorInfo, ...]]  # the components, in the parts' order
    missing: tuple[str, ...]
    scheme: tuple[int | None, int | None, str | None] | None  # bits, group size, format (None: per module)
    role_of: dict[str, str]  # suffix -> role, where role_names is None
    stray: tuple[bool, ...] | None  # which parts are components without their payload (no layout)
    method: str = ""
    payload: str = ""  # the payload's suffix
    factor: int = 1  # logical elements a stored one of the payload (with ``scheme``)
    count: tuple[int, int] | None = None  # logical count = payload elements × [0] // [1] (None: _logical_count)


def _plan(layouts: tuple[Layout, ...], index: Mapping[str, list[tuple[Layout, Part]]],
          parts: Mapping[str, TensorInfo], quant: Quantization, *, strict: bool, symmetric: bool) -> _Plan:
    """What ``_group`` does with a module of these suffixes and dtypes, as it did it module by module."""
    layout = _choose(layouts, parts)
    if layout is None:
        role_of: dict[str, str] = {}
        stray = []
        for suffix in parts:  # components without their payload
            role = None if suffix in _GENERIC else next((p.role for _, p in index[suffix] if p.role != "payload"),
                                                        None)
            if role is not None and (strict or role in _LOOSE_ROLES):
                role_of[suffix] = role
                stray.append(role not in _LOOSE_ROLES and not role.startswith("meta:"))
            else:
                stray.append(False)
        floats = tuple(s for s, t in parts.items() if s in role_of and dtypes.is_float(t.dtype))
        return _Plan(None, None, floats or None, (), _getter(()), (), None, role_of,
                     tuple(stray) if any(stray) else None)
    role_of = {s: r for s, r in _ROLE_OF[layout.name].items() if s in parts}
    names = tuple(role_of.get(s) for s in parts)
    floats = tuple(s for s, t in parts.items() if s in role_of and t.dtype in _FLOATS)
    comp_names = _COMPONENT_OF[layout.name]
    comp_keys = tuple(comp_names[s] for s in parts if s in comp_names)
    missing = tuple(role for suffix, role, need in _NEEDED[layout.name] if suffix not in parts and (
        need == "required" or not symmetric))
    if layout.one_of:
        missing += tuple(role for role in layout.one_of if role not in comp_keys)
    bits = layout.bits or quant.bits
    scheme = (bits, quant.group_size, quant.format) if quant.method not in ("mlx", "quanto") and bits is not None \
        else None  # as _module_scheme returns it for every module
    payload = parts[_PAYLOADS[layout.name].suffix]
    storage = _storage_bits(payload)
    factor = storage // bits if scheme is not None and bits and bits < storage else 1
    count = None
    if scheme is not None and (layout.shape == "same" or layout.count == "payload"):
        count = (1, 1) if layout.shape == "same" or not bits or bits >= storage else (storage, bits)
    return _Plan(layout, None if None in names else names, floats or None, comp_keys,
                 _getter(tuple(s for s in parts if s in comp_names)), missing, scheme, role_of, None,
                 quant.method if quant.known else layout.method, _PAYLOADS[layout.name].suffix, factor, count)


def _getter(suffixes: tuple[str, ...]) -> Callable[[Mapping[str, TensorInfo]], tuple[TensorInfo, ...]]:
    """The parts under these suffixes, as a tuple (itemgetter's, in C, where there are two or more)."""
    if len(suffixes) > 1:
        return itemgetter(*suffixes)  # type: ignore[return-value]
    return lambda parts: tuple(parts[s] for s in suffixes)


def _by_reader(ws: WeightSet, components: Mapping[str, str]) -> Grouped:
    """A reader's word (NNCF in an IR): its scale constants by their names' last ``/`` part, no modules."""
    roles = {}
    if components:
        for tensor in ws.tensors:
            name = tensor.name
            role = components.get(name[name.rfind("/"):]) if "/" in name else None
            if role is not None:
                roles[name] = role
    logical = sum(ws.parameters_by_dtype().values()) - sum(t.numel for t in _tensors(ws, roles))
    return Grouped((), roles, logical, ())


def _tensors(ws: WeightSet, names: Mapping[str, str]) -> Iterable[TensorInfo]:
    return (t for t in ws.tensors if t.name in names)


def _choose(layouts: tuple[Layout, ...], parts: Mapping[str, TensorInfo]) -> Layout | None:
    best: tuple[int, int] | None = None
    chosen = None
    for order, layout in enumerate(layouts):
        payload = parts.get(_PAYLOADS[layout.name].suffix)
        if payload is None:
            continue
        present = [p for p in layout.parts if p.role != "payload" and p.suffix in parts]
        evidence = (_PAYLOADS[layout.name].suffix not in _GENERIC or payload.dtype in layout.packed
                    or any(p.need != "optional" or p.role == "quant_state" for p in present))
        if not evidence:
            continue
        score = (len(present) + (payload.dtype in layout.packed), -order)
        if best is None or score > best:
            best, chosen = score, layout
    return chosen


def _symmetric(quant: Quantization) -> bool:
    """Whether zero points may be absent: GPTQ's ``sym``, compressed-tensors' weights ``symmetric``."""
    params = quant.params or {}
    if params.get("sym") is False:
        return False
    groups = params.get("config_groups")
    for scheme in groups.values() if isinstance(groups, dict) else ():
        weights = scheme.get("weights") if isinstance(scheme, dict) else None
        if isinstance(weights, dict) and weights.get("symmetric") is False:
            return False
    return True


def _module_scheme(prefix: str, layout: Layout, quant: Quantization,
                   parts: Mapping[str, TensorInfo]) -> tuple[int | None, int | None, str | None]:
    """Bits, group size and format of one module: per-module records (MLX, quanto) over the layout over the config."""
    bits, group, fmt = layout.bits or quant.bits, quant.group_size, quant.format
    if quant.method not in ("mlx", "quanto") and bits is not None:
        return bits, group, fmt  # the common case: nothing per module
    if quant.method == "mlx":
        override = _mlx_override(prefix, quant.params)
        if override is not None:
            bits, group = override.get("bits", bits), override.get("group_size", group)  # type: ignore[assignment]
    elif quant.method == "quanto" and isinstance(quant.params.get(prefix), dict):
        fmt = str(quant.params[prefix].get("weights"))  # type: ignore[union-attr]
        bits = QUANTO_BITS.get(fmt, bits)
    if bits is None:
        bits = _bits_from_shapes(layout, parts, group)
    return (bits if isinstance(bits, int) else None), (group if isinstance(group, int) else None), fmt


def _mlx_override(prefix: str, params: Mapping[str, object]) -> dict[str, object] | None:
    value = params.get(prefix)
    return value if isinstance(value, dict) else None


def _bits_from_shapes(layout: Layout, parts: Mapping[str, TensorInfo], group: int | None) -> int | None:
    """No config: GPTQ's g_idx has one entry per input row; quanto's and 8-bit payloads hold one value a byte."""
    payload = parts[_PAYLOADS[layout.name].suffix]
    g_idx = parts.get(".g_idx")
    if layout.shape == "rows" and g_idx is not None and g_idx.shape and payload.shape:
        return payload.shape[0] * 32 // g_idx.shape[0] if g_idx.shape[0] else None
    if layout.name == "quanto-qbytes" or payload.dtype in ("I8", "F8_E4M3", "F8_E5M2"):
        return 8
    if layout.name == "quanto-qbits":
        return 4
    if payload.dtype == "I32" or payload.dtype == "U32":
        return 4  # the common case; shapes alone cannot tell 4 from 8 without the config
    return None


def _storage_bits(tensor: TensorInfo) -> int:
    info = dtypes.ALL_DTYPES.get(tensor.dtype)
    return info.bits if info is not None and info.bits else 8


def _logical_count(layout: Layout, parts: Mapping[str, TensorInfo], module: QuantModule) -> int:
    payload = parts[_PAYLOADS[layout.name].suffix]
    if layout.shape == "same":  # one logical value a stored element (int8, fp8, naive-quantized int4 in I8)
        return payload.numel
    if layout.count == "bitmask":
        bitmask = parts.get(next((p.suffix for p in layout.parts if p.role == "bitmask"), ""))
        if bitmask is not None:
            return bitmask.numel * _storage_bits(bitmask)  # padded to whole bytes a row: the widths are multiples of 8
    if layout.count == "groups" and module.group_size:
        scales = parts.get(next((p.suffix for p in layout.parts if p.role == "scales"), ""))
        if scales is not None:
            return scales.numel * module.group_size
    storage, bits = _storage_bits(payload), module.bits
    if not bits or bits >= storage:
        return payload.numel
    return payload.numel * storage // bits


def _logical_shape(layout: Layout, payload: TensorInfo, bits: int | None) -> tuple[int, ...] | None:
    storage = _storage_bits(payload)
    return _shape_of(layout.shape, payload.shape, storage // bits if bits and bits < storage else 1)


def _shape_of(kind: str | None, shape: tuple[int, ...], factor: int) -> tuple[int, ...] | None:
    """The logical weight's shape from the payload's, ``factor`` logical elements a stored one."""
    if kind == "same" or (kind is not None and len(shape) < 2):
        return shape if kind == "same" else None
    if kind == "cols":
        return (*shape[:-1], shape[-1] * factor)
    if kind == "rows":
        return (shape[1], shape[0] * factor)
    if kind == "awq":
        return (shape[1] * factor, shape[0])
    if kind == "bitnet":
        return (shape[0] * factor, *shape[1:])
    if kind == "mxfp4" and len(shape) == 4:
        return (shape[0], shape[2] * shape[3] * 2, shape[1])
    return None


def is_kept_unquantized(name: str, patterns: tuple[str, ...]) -> bool:
    """A module the config keeps unquantized: listed by name (a suffix of its path), or a ``re:`` pattern
    (compressed-tensors), or a glob."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            import re

            try:
                if re.match(pattern[3:], name):
                    return True
            except re.error:
                continue
        elif name == pattern or name.endswith("." + pattern) or pattern in name.split(".") or (
                any(c in pattern for c in "*?[") and fnmatchcase(name, pattern)):
            return True
    return False
