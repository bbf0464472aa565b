"""The quantized modules of one set: its tensors grouped by prefix in one pass, each group read by the table.

Every tensor is looked up by its last few name parts in a dict built from the active layouts
(``guard.inventory.quant_conventions``), so a quantized set costs the same per tensor as any
other.  A prefix is a quantized module when its payload is there and something says it is
packed: a payload name only the method uses (``qweight``, ``W_q``), a component beside it, or
a payload dtype the method packs into (MLX's U32).  Modules of one signature (suffixes and dtypes)
form a ``Kind``, read once and applied to all of them in C; a module's own record is made only
where it is asked for (dequantizing, value checks).  Imported only for sets that are quantized.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, compress, repeat
from math import prod
from operator import floordiv, mul, not_

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
from guard.records import Record
from guard.tensors import TENSOR_DTYPE, TENSOR_NAME, TENSOR_SHAPE, TensorInfo, column, select

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a quantized set's scan imports none (~3 ms)
if TYPE_CHECKING:  # the inventory and its Quantization import this module (inside functions): no import back
    # Any, not the classes: even a type-only import back is one tests/test_architecture.py refuses
    from typing import Any as ModelInventory, Any as Quantization

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


class QuantModule(Record):
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


if TYPE_CHECKING:
    from collections.abc import Callable

    MODULE_PREFIX: Callable[[QuantModule], str]
else:
    MODULE_PREFIX = TENSOR_NAME  # a record's first field, in C: a QuantModule's prefix, as a TensorInfo's name


class Kind(Record):
    """The modules of one signature (their suffixes and dtypes): one plan, worked out once, for all of them."""

    plan: _Plan
    prefixes: list[str]
    columns: dict[str, list[TensorInfo]]  # suffix -> each module's tensor, in ``prefixes``' order
    quant: Quantization
    layout: Layout  # the plan's layout: a plan without one makes no kind
    built: list[QuantModule] | None = None  # the records, where the logical count needed them module by module

    def parts(self, i: int) -> dict[str, TensorInfo]:
        """Module ``i``'s tensors by suffix."""
        return {suffix: column[i] for suffix, column in self.columns.items()}

    def module(self, i: int) -> QuantModule:
        if self.built is not None:
            return self.built[i]
        return _module(self.plan, self.prefixes[i], self.parts(i), self.quant)

    def payload(self, i: int) -> TensorInfo:
        return self.columns[self.plan.payload][i]

    def components(self, i: int) -> dict[str, TensorInfo]:
        """Module ``i``'s components by role (CG111's shapes without a look-up by name)."""
        columns = self.columns
        return {role: columns[suffix][i] for role, suffix in self.plan.components.items()}


class Grouped:
    """What the grouping found; the module records themselves are made on first use (a scan's rules read
    ``kinds``: one plan for many modules, so a clean set never makes a record a module)."""

    __slots__ = ("roles", "logical", "stray", "fallback", "kinds", "_modules")

    def __init__(self, kinds: tuple[Kind, ...], roles: dict[str, str], logical: int, stray: tuple[str, ...],
                 fallback: bool = False) -> None:
        self.kinds = kinds  # the quantized modules (a layout), by signature
        self.roles = roles  # tensor name -> role
        self.logical = logical  # the set's logical parameter count
        self.stray = stray  # component names with no module (a payload missing: CG110)
        self.fallback = fallback  # nothing was packed the declared way: read by every layout (CG112 says so)
        self._modules: tuple[QuantModule, ...] | None = None

    @property
    def modules(self) -> tuple[QuantModule, ...]:
        """Every quantized module, by prefix."""
        if self._modules is None:
            made = [kind.built if kind.built is not None else list(map(kind.module, range(len(kind.prefixes))))
                    for kind in self.kinds]
            self._modules = tuple(sorted(chain.from_iterable(made), key=MODULE_PREFIX))
        return self._modules


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
    return cached


def _group(ws: WeightSet, quant: Quantization) -> Grouped:
    layouts = active_layouts(quant)
    index: dict[str, list[tuple[Layout, Part]]] = {}
    for layout in layouts:
        for part in layout.parts:
            index.setdefault(part.suffix, []).append((layout, part))
    strict = quant.known and quant.method in LAYOUTS_BY_METHOD
    symmetric = _symmetric(quant)
    kinds: list[Kind] = []
    roles: dict[str, str] = {}
    stray: list[str] = []
    logical = 0
    component_floats = 0  # the floating elements that are components, not parameters
    # what a module's suffixes and dtypes decide (its layout, roles, components, missing roles, which parts are
    # floats) is worked out once for each such signature, and applied to all its modules at once, in C
    columns, others = _columns(ws, index)
    for prefixes, aligned in _by_signature(columns):
        first = {suffix: column[0] for suffix, column in aligned.items()}
        plan = _plan(layouts, index, first, quant, strict=strict, symmetric=symmetric)
        if others is not None and len(plan.role_of) < len(aligned):
            others = None  # some tensor a suffix picked has no role: no longer the tensors left out of ``roles``
        for suffix, role in plan.role_of.items():
            roles.update(zip(map(TENSOR_NAME, aligned[suffix]), repeat(role)))
        for suffix in plan.floats:
            component_floats += sum(map(prod, map(TENSOR_SHAPE, aligned[suffix])))
        planned = plan.layout
        if planned is None:
            for suffix in plan.stray:
                stray.extend(map(TENSOR_NAME, aligned[suffix]))
            continue
        kind = Kind(plan, prefixes, aligned, quant, planned)
        if plan.count is not None:  # _logical_count's "payload" arithmetic, its factors worked out once
            stored, bits = plan.count
            elements = map(prod, map(TENSOR_SHAPE, aligned[plan.payload]))
            logical += sum(elements) if stored == bits else sum(map(floordiv, map(mul, elements, repeat(stored)),
                                                                    repeat(bits)))
        else:  # counted module by module (scales × group size, a bitmask, bits per module): the records first
            parts = list(map(kind.parts, range(len(prefixes))))
            built = list(map(_module, repeat(plan), prefixes, parts, repeat(quant)))
            kind = kind._replace(built=built)
            logical += sum(map(_logical_count, repeat(planned), parts, built))
        kinds.append(kind)
    if strict and not kinds and quant.method in LAYOUTS_BY_METHOD and layouts is not LAYOUTS:
        # nothing packed the declared way: read the tensors by every layout, so the count stays logical
        # (CG112 says the declaration is wrong)
        again = _group(ws, quant._replace(known=False, bits=None, group_size=None))
        return Grouped(again.kinds, again.roles, again.logical, again.stray, True)
    floats = sum(n for code, n in ws.parameters_by_dtype().items() if dtypes.is_float(code))
    if others is not None:
        ws.memo[_UNROLED] = (roles, others)
    return Grouped(tuple(kinds), roles, logical + floats - component_floats, tuple(sorted(stray)))


def _columns(ws: WeightSet, index: Mapping[str, object]) -> tuple[dict[str, dict[str, TensorInfo]],
                                                                   list[TensorInfo] | None]:
    """Suffix -> module prefix -> its tensor, in one pass over the set's tensors; and where every suffix is one
    name part, the tensors no suffix picked, in the set's order (None: not kept)."""
    columns: dict[str, dict[str, TensorInfo]] = {suffix: {} for suffix in index}
    every = chain.from_iterable(scan.tensors for scan in ws.files) if ws.layout != "lightning" else ws.tensors
    if all(s.startswith(".") and s.count(".") == 1 for s in index):
        # every suffix is one name part (GPTQ, AWQ, MLX, ...): the last part names it, the rest is the prefix
        column_of = {suffix[1:]: column for suffix, column in columns.items()}.get
        others: list[TensorInfo] = []
        for tensor in every:
            prefix, _, last = tensor[0].rpartition(".")
            column = column_of(last)
            if column is not None and prefix:
                column[prefix] = tensor
            else:
                others.append(tensor)
        return columns, others
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
                    columns[suffix][name[:len(name) - len(suffix)]] = tensor
    return columns, None


def _by_signature(columns: Mapping[str, dict[str, TensorInfo]]) -> Iterator[tuple[list[str],
                                                                                  dict[str, list[TensorInfo]]]]:
    """The module prefixes by signature (which suffixes each has, and their dtypes), each group's tensors as
    columns in its prefixes' order.  Most sets have one signature a layout (every module has the same parts, of
    the same dtypes), told in C without a tuple a module; a few more are told apart in C too."""
    present = {suffix: column for suffix, column in columns.items() if column}
    if not present:
        return
    first = next(iter(present.values()))
    prefixes = list(first)
    # the same prefixes, in the same order where a module's tensors are written together (compared as lists)
    in_order = {suffix: list(column) == prefixes for suffix, column in present.items()}
    if all(in_order.values()) or all(column.keys() == first.keys() for column in present.values()):
        aligned = {suffix: list(column.values()) if in_order[suffix] else list(map(column.__getitem__, prefixes))
                   for suffix, column in present.items()}
        if all(len(set(map(TENSOR_DTYPE, column))) == 1 for column in aligned.values()):
            yield prefixes, aligned
            return
    names = list(dict.fromkeys(chain.from_iterable(present.values())))
    # each prefix's dtype under each suffix (None: not there), one tuple a prefix
    signatures = list(zip(*(map(dict(zip(column, map(TENSOR_DTYPE, column.values()))).get, names)
                            for column in present.values())))
    distinct = dict.fromkeys(signatures)
    groups: Iterator[tuple[tuple[str | None, ...], list[str]]]
    if len(distinct) <= _FEW:
        groups = ((signature, list(compress(names, map(signature.__eq__, signatures)))) for signature in distinct)
    else:
        by_signature: dict[tuple[str | None, ...], list[str]] = {}
        for prefix, signature in zip(names, signatures):
            by_signature.setdefault(signature, []).append(prefix)
        groups = iter(by_signature.items())
    for signature, prefixes in groups:
        yield prefixes, {suffix: list(map(column.__getitem__, prefixes))
                         for (suffix, column), dtype in zip(present.items(), signature) if dtype is not None}


_UNROLED = "unroled tensors"  # ws.memo: (roles, the set's tensors not in them)
_FEW = 16  # signatures told apart by one pass each over all of them; more: one Python pass


def _module(plan: _Plan, prefix: str, parts: Mapping[str, TensorInfo], quant: Quantization) -> QuantModule:
    layout: Layout = plan.layout  # type: ignore[assignment]  # callers pass plans with a layout
    payload = parts[plan.payload]
    components = {role: parts[suffix].name for role, suffix in plan.components.items()}
    if plan.scheme is not None:  # the common case: bits, group size and format the same for every module
        bits, group, fmt = plan.scheme
        return QuantModule(prefix, plan.method, payload.name, prefix + layout.weight, components,
                           _shape_of(layout.shape, payload.shape, plan.factor), bits, group, fmt, layout.name,
                           plan.missing)
    bits, group, fmt = _module_scheme(prefix, layout, quant, parts)
    return QuantModule(prefix, plan.method, payload.name, prefix + layout.weight, components,
                       _logical_shape(layout, payload, bits), bits, group, fmt, layout.name, plan.missing)


class _Plan(Record):
    layout: Layout | None
    floats: tuple[str, ...]  # the suffixes of the floating components
    components: dict[str, str]  # role -> suffix: QuantModule.components, in the parts' order
    missing: tuple[str, ...]
    scheme: tuple[int | None, int | None, str | None] | None  # bits, group size, format (None: per module)
    role_of: dict[str, str]  # suffix -> role, for the parts that have one
    stray: tuple[str, ...] = ()  # the suffixes of components without their payload (no layout)
    method: str = ""
    payload: str = ""  # the payload's suffix
    factor: int = 1  # logical elements a stored one of the payload (with ``scheme``)
    count: tuple[int, int] | None = None  # type: ignore[assignment]  # a field named count shadows tuple.count, as namedtuple allows; logical count = payload elements × [0] // [1] (None: _logical_count)


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
                if role not in _LOOSE_ROLES and not role.startswith("meta:"):
                    stray.append(suffix)
        floats = tuple(s for s, t in parts.items() if s in role_of and dtypes.is_float(t.dtype))
        return _Plan(None, floats, {}, (), None, role_of, tuple(stray))
    role_of = {s: r for s, r in _ROLE_OF[layout.name].items() if s in parts}
    floats = tuple(s for s, t in parts.items() if s in role_of and t.dtype in _FLOATS)
    comp_names = _COMPONENT_OF[layout.name]
    components = {comp_names[s]: s for s in parts if s in comp_names}
    missing = tuple(role for suffix, role, need in _NEEDED[layout.name] if suffix not in parts and (
        need == "required" or not symmetric))
    if layout.one_of:
        missing += tuple(role for role in layout.one_of if role not in components)
    bits = layout.bits or quant.bits
    scheme = (bits, quant.group_size, quant.format) if quant.method not in ("mlx", "quanto") and bits is not None \
        else None  # as _module_scheme returns it for every module
    payload = parts[_PAYLOADS[layout.name].suffix]
    storage = _storage_bits(payload)
    factor = storage // bits if scheme is not None and bits and bits < storage else 1
    count = None
    if scheme is not None and (layout.shape == "same" or layout.count == "payload"):
        count = (1, 1) if layout.shape == "same" or not bits or bits >= storage else (storage, bits)
    return _Plan(layout, floats, components, missing, scheme, role_of, (),
                 quant.method if quant.known else layout.method, _PAYLOADS[layout.name].suffix, factor, count)


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


def unroled_tensors(ws: WeightSet, roles: Mapping[str, str]) -> list[TensorInfo]:
    """``ws.tensors`` that are no part of quantization (not in ``roles``), in the set's order: once per set (the
    shares by label, CG112 and CG113 read them), kept by the grouping where it can tell, else picked in C."""
    memo = ws.memo.get(_UNROLED)
    if memo is not None and memo[0] is roles:
        return memo[1]
    if ws.layout == "lightning":  # ``tensors`` leaves training state out
        left = [t for t in ws.tensors if t.name not in roles]
    else:
        has = roles.__contains__
        left = list(chain.from_iterable(select(scan.tensors, map(not_, map(has, column(TENSOR_NAME, scan.tensors))))
                                        for scan in ws.files))
    ws.memo[_UNROLED] = (roles, left)
    return left



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
            bits, group = override.get("bits", bits), override.get("group_size", group)
    elif quant.method == "quanto" and isinstance(quant.params.get(prefix), dict):
        fmt = str(quant.params[prefix].get("weights"))
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
