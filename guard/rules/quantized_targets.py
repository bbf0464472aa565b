"""A quantization config's groups resolved against the set's modules, as the loader resolves them.

CG110 (with ``guard.rules.quantized``'s own CG110, which reads the table's layouts):
- compressed-tensors: every module a ``config_groups[*].targets`` entry selects and no ``ignore`` entry
  excludes is loaded as quantized.  Resolved as ``compressed_tensors.utils.match.is_match`` does: a plain
  entry is a full module name (equality), ``re:`` a regex ``re.match``-ed from the name's start, anything
  else a class name.  The scan reads headers only, so the only class it can tell is ``Linear``: a module
  with a 2-D floating ``weight`` whose name is no embedding's (and none in GPT-2's family, whose Conv1D
  projections have 2-D weights too).  Another class name in the targets selects
  nothing here; in ``ignore`` (it could exclude a Linear subclass) the set is not judged.  A targeted
  Linear stored plain, with no ``weight_scale``, is what transformers reports as ``<module>.weight_scale``
  missing and vLLM runs as quantized (llm-compressor#2641, vllm#52501).
- ModelOpt: ``input_scale`` where the config quantizes input activations statically (``quant_algo`` FP8
  or NVFP4, or a config group whose ``input_activations`` is not dynamic).  vLLM allocates the scale and
  never fills it: read as 0 (vllm#45212, vllm#54189).

CG129: a ModelOpt ``quant_algo`` NVFP4 set whose every config group has ``input_activations: null`` is
weight-only and legitimate; vLLM's fused-MoE path before #54427 folds the unfilled ``input_scale`` into
every expert (vllm#54189).  A note, never an error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from itertools import chain, repeat
from operator import itemgetter

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.findings import Finding, shown
from guard.inventory import ModelInventory, WeightSet
from guard.inventory.quantization import Quantization
from guard.tensors import TENSOR_NAME, column

SHOWN = 8  # module names a finding lists before "and N more"
# Last name parts of embeddings (nn.Embedding has a 2-D weight too, and "Linear" never selects it): token and
# position embeddings, T5's shared embedding and its relative attention bias (an nn.Embedding)
_EMBEDDING_PARTS = ("embed", "wte", "wpe", "shared", "relative_attention_bias")
# model_types whose projections are transformers' Conv1D (2-D weights, no Linear): "Linear" selects none of them
_CONV1D_MODEL_TYPES = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})
_STATIC_ALGOS = frozenset({"FP8", "NVFP4"})  # ModelOpt's quant_algo with static input scales (convert_hf_config.py)
_CLASS_NAME = re.compile(r"[A-Z][A-Za-z0-9_]*")
_LINEAR = ("Linear", "LinearBase")  # vLLM's LinearBase matches "Linear" too (match.py _match_class)
_NO_CONFIG = frozenset({"tensor dtypes", "file metadata", "report", "tensor names"})


def check_targeted_modules(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws, quant in _judged(inv):
        if quant.method == "compressed-tensors":
            yield from (f._replace(set=ws.name) for f in _unscaled_targets(inv, ws, quant))
        elif quant.method == "modelopt":
            yield from (f._replace(set=ws.name) for f in _missing_input_scales(inv, ws, quant))


def check_runtime_caveats(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws, quant in _judged(inv):
        if quant.method == "modelopt" and weight_only_nvfp4(quant):
            yield make_finding(
                "CG129", inv.config_path or ws.name,
                f"{quant.declared_by} says quant_algo NVFP4 with input_activations null in every config group: "
                "a weight-only set (no input_scale tensors), which is legitimate.  vLLM releases without #54427 "
                "run its MoE experts on the W4A4 path and fold an uninitialised input_scale (read as 0) into "
                "every expert: the model repeats one token (vllm#54189).  Serve it with a vLLM that has #54427, "
                "or declare quant_algo W4A16_NVFP4")._replace(set=ws.name)


def _judged(inv: ModelInventory) -> Iterator[tuple[WeightSet, Quantization]]:
    """The sets a config declares a known method for (as ``guard.rules.quantized._each_set``, less the sets
    read from tensor names alone: no config, no groups)."""
    for ws in inv.sets:
        quant = inv.quantization(ws)
        if quant is not None and ws.judged and quant.known and quant.declared_by not in _NO_CONFIG:
            yield ws, quant


# ------------------------------------------------------------------ compressed-tensors


class Entries:
    """One list of ``targets`` or ``ignore`` entries, as ``is_match`` reads each: full names (a set: a long
    ``ignore`` list costs one lookup a module), ``re:`` patterns (``re.match``), and whether ``Linear`` is named.
    A pattern that does not compile matches nothing (compressed-tensors raises on it)."""

    def __init__(self, entries: list[str]) -> None:
        self.names = frozenset(e for e in entries if not e.startswith("re:"))
        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        for entry in dict.fromkeys(e for e in entries if e.startswith("re:")):
            try:
                self.patterns.append((entry, re.compile(entry[3:])))
            except re.error:
                continue
        self.linear = not self.names.isdisjoint(_LINEAR)

    def match(self, module: str, *, linear: bool) -> bool:
        return (linear and self.linear) or module in self.names or any(p.match(module) for _, p in self.patterns)


class Targets:
    """The config's weight-quantizing groups and its ``ignore`` list, compiled once."""

    def __init__(self, groups: list[tuple[str, list[str]]], ignore: list[str]) -> None:
        self.groups = [(group, Entries(targets)) for group, targets in groups]  # the groups that quantize weights
        self.ignore = Entries(ignore)
        self.ignore_entries = ignore

    def group_of(self, module: str) -> str | None:
        """The first group whose targets select the Linear ``module`` while ``ignore`` does not exclude it."""
        if self.ignore.match(module, linear=True):
            return None
        return next((group for group, targets in self.groups if targets.match(module, linear=True)), None)


def compressed_tensors_targets(quant: Quantization) -> Targets | None:
    """The targets, where headers can resolve them (None: no weight group, or a class in ``ignore`` that
    could exclude a Linear the scan cannot tell apart)."""
    params = quant.params
    groups = params.get("config_groups")
    if not isinstance(groups, dict):
        return None
    weighted = []
    for group, scheme in groups.items():
        if isinstance(scheme, dict) and isinstance(scheme.get("weights"), dict):
            targets = scheme.get("targets")
            if isinstance(targets, list):
                weighted.append((str(group)[:80], [t for t in targets if isinstance(t, str)]))
    ignore = params.get("ignore")
    ignore = [e for e in ignore if isinstance(e, str)] if isinstance(ignore, list) else []
    if not weighted or any(_CLASS_NAME.fullmatch(e) and e not in _LINEAR for e in ignore):
        return None
    return Targets(weighted, ignore)


def _is_linear_weight(name: str, shape: tuple[int, ...], dtype: str) -> bool:
    if len(shape) != 2 or not name.endswith(".weight") or not dtypes.is_float(dtype):
        return False
    module = name[:-7]
    last = module[module.rfind(".") + 1:].lower()
    return bool(module) and not any(part in last for part in _EMBEDDING_PARTS)


def unscaled_targets(inv: ModelInventory, ws: WeightSet, quant: Quantization) -> dict[str, list[str]]:
    """Group name -> the Linear modules it targets that are stored plain (no component of any layout)."""
    targets = compressed_tensors_targets(quant)
    config = inv.config
    if targets is None or (isinstance(config, dict) and config.get("model_type") in _CONV1D_MODEL_TYPES):
        return {}
    from guard.inventory.quant_modules import grouped, unroled_tensors

    found: dict[str, list[str]] = {}
    for tensor in unroled_tensors(ws, grouped(inv, ws).roles):
        if _is_linear_weight(tensor.name, tensor.shape, tensor.dtype):
            module = tensor.name[:-7]
            group = targets.group_of(module)
            if group is not None:
                found.setdefault(group, []).append(module)
    return found


def _unscaled_targets(inv: ModelInventory, ws: WeightSet, quant: Quantization) -> Iterator[Finding]:
    found = unscaled_targets(inv, ws, quant)
    if not found:
        return
    targets = compressed_tensors_targets(quant)
    assert targets is not None
    stale = _unmatched_ignore(ws, targets.ignore_entries)
    hint = (f"; ignore entries that match no module of the file (renamed since?): "
            f"{', '.join(shown(e, 80) for e in stale[:SHOWN])}" if stale else "")
    for group, modules in sorted(found.items()):
        modules.sort(key=lambda m: (any(p.isdigit() for p in m.split(".")), m))  # lm_head before the layers
        listed = ", ".join(shown(m, 80) for m in modules[:SHOWN])
        more = f" and {len(modules) - SHOWN} more" if len(modules) > SHOWN else ""
        first = modules[0] + ".weight"
        yield make_finding(
            "CG110", _file_of(ws, first),
            f"{len(modules)} Linear module(s) that config_groups[{shown(group, 40)}].targets select and ignore does "
            f"not exclude are stored unquantized, with no weight_scale: {listed}{more}.  compressed-tensors "
            f"loads them as quantized (transformers reports {shown(modules[0] + '.weight_scale', 80)} missing; vLLM "
            f"runs them with unfilled scales){hint}", tensor=first)


def _file_of(ws: WeightSet, name: str) -> str:
    """The file of a finding's example tensor (read only where there is a finding)."""
    return next((scan.path for scan in ws.files if any(t.name == name for t in scan.tensors)), ws.name)


def _unmatched_ignore(ws: WeightSet, ignore: list[str]) -> list[str]:
    """The ``ignore`` entries that name no module of the set (read only where there is a finding): the module
    names made in C, the first ``SHOWN`` patterns tried against them."""
    names = chain.from_iterable(column(TENSOR_NAME, scan.tensors) for scan in ws.files)
    modules = set(map(itemgetter(0), map(str.rpartition, names, repeat("."))))
    stale = {entry for entry, pattern in Entries(ignore).patterns[:SHOWN] if not any(map(pattern.match, modules))}
    return [entry for entry in dict.fromkeys(ignore) if entry in stale or (
        not entry.startswith("re:") and entry not in _LINEAR and not _CLASS_NAME.fullmatch(entry)
        and entry not in modules)]


# ------------------------------------------------------------------ ModelOpt


def _modelopt_record(quant: Quantization) -> Mapping[str, object]:
    nested = quant.params.get("quantization")
    return nested if isinstance(nested, dict) else quant.params


def _input_groups(quant: Quantization) -> list[object] | None:
    """Each config group's ``input_activations`` (None: the config has no config_groups)."""
    groups = _modelopt_record(quant).get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return None
    return [scheme.get("input_activations") if isinstance(scheme, dict) else None for scheme in groups.values()]


def weight_only_nvfp4(quant: Quantization) -> bool:
    groups = _input_groups(quant)
    return str(_modelopt_record(quant).get("quant_algo", "")).upper() == "NVFP4" and groups is not None and all(
        g is None for g in groups)


def static_input_scales(quant: Quantization) -> bool:
    """Whether the config quantizes input activations with a stored (static) scale."""
    groups = _input_groups(quant)
    if groups is not None:
        return any(isinstance(g, dict) and g.get("dynamic") is not True for g in groups)
    return str(_modelopt_record(quant).get("quant_algo", "")).upper() in _STATIC_ALGOS


def _missing_input_scales(inv: ModelInventory, ws: WeightSet, quant: Quantization) -> Iterator[Finding]:
    if not static_input_scales(quant):
        return
    from guard.inventory.quant_modules import grouped

    found = grouped(inv, ws)
    if found.fallback:
        return  # nothing packed the declared way: CG112 says so
    for kind in found.kinds:
        if kind.layout.method != "modelopt" or ".input_scale" in kind.columns:
            continue
        first = min(kind.prefixes)
        payload = kind.payload(kind.prefixes.index(first)).name
        yield make_finding(
            "CG110", _file_of(ws, payload),
            f"{len(kind.prefixes)} {kind.layout.name} module(s) have no input_scale while {quant.declared_by} "
            f"quantizes their input activations statically (quant_algo {shown(str(quant.format), 40)}): vLLM "
            f"reads the missing {shown(first + '.input_scale')} as 0 and zeroes the module's output "
            "(vllm#45212, vllm#54189)", tensor=payload)
