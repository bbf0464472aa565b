"""CG110-CG113: a quantized set's integrity, from headers (what transformers would fail on, or load as garbage).

CG110: a packed weight without a component its method needs; CG111: payloads and scales whose
shapes disagree with the declared bits and group size (a truncated payload, a wrong ``bits``);
CG112: a declared method no tensor is packed by, or tensors packed by a method nobody declared;
CG113: modules the config keeps unquantized that are packed, or quantized siblings stored unpacked.
Each reads the modules grouped by ``guard.inventory.quant_modules`` from the table; one finding per
kind of defect and set, with a count and an example, never one per tensor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from itertools import chain, compress, repeat

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.findings import Finding, shown
from guard.inventory import ModelInventory, WeightSet
from guard.inventory.quantization import Quantization
from guard.tensors import TENSOR_NAME, TensorInfo

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a quantized set's scan imports none (~3 ms)
if TYPE_CHECKING:
    from collections.abc import Callable

    from guard.inventory.quant_modules import Grouped

    SetCheck = Callable[[ModelInventory, WeightSet, Quantization, Grouped], Iterator[Finding]]

# Methods whose weights sit in tensor subclasses or layouts the headers do not show (torchao's pickled
# subclasses): no tensor is expected to be packed by name.
_NO_NAMED_LAYOUT = frozenset({"torchao"})
# Where a reader's word or the dtypes alone say "quantized" (GGUF, NNCF, Core ML): no layout of the table applies.
_NOT_NAMED_BY_LAYOUT = frozenset({"tensor dtypes", "file metadata", "report"})
# Methods that share a fingerprint: GPTQ and AWQ both write qweight/qzeros/scales.
_SAME_FAMILY = {"awq": "gptq"}


def _each_set(inv: ModelInventory, check: SetCheck) -> Iterator[Finding]:
    for ws in inv.sets:
        quant = inv.quantization(ws)
        if quant is None or not ws.judged or quant.declared_by in _NOT_NAMED_BY_LAYOUT or not quant.known:
            continue  # a method the table does not know: reported quantized, with a note, never judged
        from guard.inventory.quant_modules import grouped  # only where a set is quantized

        yield from (f._replace(set=ws.name) for f in check(inv, ws, quant, grouped(inv, ws)))


def check_quantized_components(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    return _each_set(inv, _missing_components)


def check_quantized_shapes(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    return _each_set(inv, _shape_findings)


def check_quantization_method(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    return _each_set(inv, _method_findings)


def check_quantized_modules(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    return _each_set(inv, _kept_findings)


def _missing_components(inv: ModelInventory, ws: WeightSet, quant: Quantization, found: Grouped) -> Iterator[Finding]:
    # (layout, role) -> modules without it, and the first of them by prefix: a kind's modules all miss the same
    by_role: dict[tuple[str, str], tuple[int, tuple[str, str]]] = {}
    for kind in found.kinds:
        if kind.plan.missing:
            first = min(kind.prefixes)
            example = (first, kind.payload(kind.prefixes.index(first)).name)
            for role in kind.plan.missing:
                key = (kind.layout.name, role)
                count, seen = by_role.get(key, (0, example))
                by_role[key] = (count + len(kind.prefixes), min(seen, example))
    files = _files(ws)
    for (layout, role), (count, (prefix, payload)) in sorted(by_role.items()):
        yield make_finding(
            "CG110", files.get(payload, ws.name),
            f"{count} packed weight(s) ({layout}) have no {role} tensor, which {quant.method} needs to "
            f"load them; e.g. {shown(payload)}{_read_as_zero(quant, layout, role, prefix)}", tensor=payload)
    stray = found.stray
    if stray:
        yield make_finding(
            "CG110", files.get(stray[0], ws.name),
            f"{len(stray)} {quant.method} component tensor(s) have no packed weight beside them (the payload is "
            f"missing); e.g. {shown(stray[0])}", tensor=stray[0])


def _read_as_zero(quant: Quantization, layout: str, role: str, prefix: str) -> str:
    """What a runtime makes of a missing ModelOpt scale: vLLM allocates it and never fills it."""
    if quant.method != "modelopt":
        return ""
    from guard.inventory.quant_conventions import LAYOUTS

    suffix = next((p.suffix for lay in LAYOUTS if lay.name == layout for p in lay.parts if p.role == role), "")
    return f": vLLM reads the missing {shown(prefix + suffix)} as 0 (vllm#45212)" if suffix else ""


def _shape_findings(inv: ModelInventory, ws: WeightSet, quant: Quantization, found: Grouped) -> Iterator[Finding]:
    from guard.rules.quantized_shapes import kind_shape_problems

    if found.fallback:
        return  # the declaration is wrong (CG112): its bits and group size say nothing of these tensors
    problems: dict[str, list[tuple[str, str, str]]] = defaultdict(list)  # layout -> (prefix, payload, problem)
    for kind in found.kinds:
        problems[kind.layout.name].extend(kind_shape_problems(kind))
    files = _files(ws)
    for layout, items in sorted(problems.items()):
        if items:
            _, payload, problem = min(items)  # the first module by prefix
            yield make_finding(
                "CG111", files.get(payload, ws.name),
                f"{len(items)} {layout} module(s) disagree with {_scheme(quant)}; e.g. {shown(payload)}: {problem}",
                tensor=payload)


def _scheme(quant: Quantization) -> str:
    parts = [f"bits {quant.bits}" if quant.bits else "", f"group size {quant.group_size}" if quant.group_size else ""]
    said = ", ".join(p for p in parts if p)
    return f"the declared {quant.method} scheme ({said})" if said else f"the {quant.method} layout"


def _method_findings(inv: ModelInventory, ws: WeightSet, quant: Quantization, found: Grouped) -> Iterator[Finding]:
    from guard.inventory.quantization import _from_tensor_names

    where = inv.config_path or ws.name
    if quant.declared_by == "tensor names":
        if inv.config_path is not None and ws.primary:  # a model with a config that says nothing of it
            example = str(quant.params.get("example", ""))
            yield make_finding(
                "CG112", inv.config_path,
                f"tensors are packed by {quant.method} (e.g. {shown(example)}) but config.json declares no "
                "quantization_config: transformers loads them as plain weights, with unexpected keys",
                tensor=example or None)
        return
    if quant.method in _NO_NAMED_LAYOUT:
        return
    # read by every layout when nothing was packed the declared way: the modules say which method packed them
    named = _from_tensor_names(ws, known={} if found.fallback else found.roles)
    if named is not None and _SAME_FAMILY.get(named.method, named.method) != _SAME_FAMILY.get(
            quant.method, quant.method) and named.method != "mlx":
        example = str(named.params.get("example", ""))
        yield make_finding(
            "CG112", where,
            f"{quant.declared_by} declares {quant.method}, but tensors are packed by "
            f"{'gptq or awq' if named.method == 'gptq' else named.method}; e.g. "
            f"{shown(example)}", tensor=example or None)
    elif (found.fallback or not found.kinds) and ws.has_tensors:
        floats = sorted(code for code in ws.by_dtype() if dtypes.is_float(code))
        yield make_finding(
            "CG112", where,
            f"{quant.declared_by} declares {quant.label}, but no tensor of {ws.name} is packed that way (its "
            f"floating tensors are {', '.join(dtypes.display_name(c) for c in floats) or 'none'}): a re-save "
            "after dequantizing, or the wrong config")


def _kept_findings(inv: ModelInventory, ws: WeightSet, quant: Quantization, found: Grouped) -> Iterator[Finding]:
    from guard.inventory.quant_modules import unroled_tensors

    kinds = found.kinds
    roles = found.roles
    files = _files(ws)
    packed_kept = _packed_kept(found, quant.unquantized) if quant.unquantized else []
    if packed_kept:
        yield make_finding(
            "CG113", files.get(packed_kept[0], ws.name),
            f"{len(packed_kept)} module(s) the config keeps unquantized are packed; e.g. {shown(packed_kept[0])}",
            tensor=packed_kept[0])
    if quant.method == "compressed-tensors":
        from guard.rules.quantized_targets import compressed_tensors_targets

        if compressed_tensors_targets(quant) is not None:
            return  # its targets resolve from the headers: CG110 names each targeted module stored plain
    siblings: _Siblings | None = None  # both built at the first candidate: a fully packed set has none
    suffixes: set[str] | None = None
    unpacked: list[str] = []
    # a sibling of packed modules (same name but the layer number), stored plain: the tensors that are no
    # component, picked in C (a fully packed set leaves none for the loop)
    for tensor in unroled_tensors(ws, roles):
        name = tensor.name
        if len(tensor.shape) != 2 or not dtypes.is_float(tensor.dtype):
            continue
        prefix, dot, last = name.rpartition(".")
        if suffixes is None:
            suffixes = {kind.layout.weight for kind in kinds}
        if not dot or "." + last not in suffixes:
            continue
        if siblings is None:
            siblings = _Siblings(found)
        if not siblings.packed(prefix):
            continue
        if not (quant.unquantized and is_kept_unquantized(prefix, quant.unquantized)):
            unpacked.append(name)
    if unpacked:
        yield make_finding(
            "CG113", files.get(unpacked[0], ws.name),
            f"{len(unpacked)} weight(s) are stored unpacked ({dtypes.display_name(_dtype(ws, unpacked[0]))}) while "
            f"the same module in other layers is packed ({quant.label}) and the config does not keep them "
            f"unquantized; e.g. {shown(unpacked[0])}", tensor=unpacked[0])


def _packed_kept(found: Grouped, patterns: tuple[str, ...]) -> list[str]:
    """The payloads of the packed modules the config keeps unquantized, by prefix.  A plain name matches only
    prefixes that contain it: those are picked in C, then checked (a ``re:`` pattern or a glob: every module)."""
    plain = not any(p.startswith("re:") or any(c in p for c in "*?[") for p in patterns)
    kept: list[tuple[str, str]] = []
    for kind in found.kinds:
        prefixes = kind.prefixes
        picked: Iterable[int] = range(len(prefixes))
        if plain:
            picked = sorted(set(chain.from_iterable(
                compress(picked, map(str.__contains__, prefixes, repeat(p))) for p in patterns)))
        kept.extend((prefixes[i], kind.payload(i).name) for i in picked if is_kept_unquantized(prefixes[i], patterns))
    return [payload for _, payload in sorted(kept)]


class _Siblings:
    """Whether a prefix names a packed module's sibling: the same module in another layer (``_layer_pattern``).
    Only the packed prefixes that can be one are read, those ending with the candidate's parts after its last
    layer number, picked in C (a set's embeddings and lm_head match none); once for each such ending."""

    def __init__(self, found: Grouped) -> None:
        self.prefixes = list(chain.from_iterable(kind.prefixes for kind in found.kinds))
        self.patterns: dict[str, set[str]] = {}  # ending -> the layer patterns of the packed prefixes with it

    def packed(self, prefix: str) -> bool:
        parts = prefix.split(".")
        numbered = [i for i, part in enumerate(parts) if part.isdigit()]
        # equal patterns have equal parts after the last number ("#" as a name would stand for one: read them all)
        ending = "" if "#" in prefix else ".".join(parts[numbered[-1] + 1:]) if numbered else prefix
        patterns = self.patterns.get(ending)
        if patterns is None:
            prefixes = self.prefixes
            picked = compress(prefixes, map(str.endswith, prefixes, repeat(ending))) if ending else prefixes
            patterns = self.patterns[ending] = set(map(_layer_pattern, picked))
        return _layer_pattern(prefix) in patterns


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
        elif name == pattern or name.endswith("." + pattern) or pattern in name.split("."):
            return True
        elif any(c in pattern for c in "*?["):
            from fnmatch import fnmatchcase  # a glob in the config: not on a plain scan's import path

            if fnmatchcase(name, pattern):
                return True
    return False


def _layer_pattern(prefix: str) -> str:
    """``model.layers.3.mlp.down_proj`` -> ``model.layers.#.mlp.down_proj``: the same module in every layer."""
    return ".".join("#" if part.isdigit() else part for part in prefix.split("."))


def _by_name(ws: WeightSet) -> dict[str, TensorInfo]:
    """Tensor name -> tensor, once per set (shapes for CG111, files for every finding's example)."""
    found = ws.memo.get("tensors by name")
    if found is None:
        if ws.layout == "lightning":
            found = {t.name: t for t in ws.tensors}
        else:  # built in C, file by file: the same map, the later of two equal names kept
            found = {}
            for scan in ws.files:
                found.update(zip(map(TENSOR_NAME, scan.tensors), scan.tensors))
        ws.memo["tensors by name"] = found
    return found


class _Files:
    """Tensor name -> its file, read off ``_by_name`` (the findings name the file of their example)."""

    def __init__(self, ws: WeightSet) -> None:
        self.ws = ws  # the map is built on the first finding, never for a clean set

    def get(self, name: str, default: str) -> str:
        tensor = _by_name(self.ws).get(name)
        return tensor.file if tensor is not None else default


def _files(ws: WeightSet) -> _Files:
    return _Files(ws)


def _dtype(ws: WeightSet, name: str) -> str:
    tensor = _by_name(ws).get(name)
    return tensor.dtype if tensor is not None else ""
