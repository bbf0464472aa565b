"""CG103: config.json's declared dtype against the primary set; a .keras file's layer policies.

save_pretrained rewrites config.json on every save, so the last save wins: a
config that matches a variant rather than the default weights says so.
transformers v5 loads in the declared dtype by default, so a config narrower
than the weights is a silent downcast (an error); the other way is a warning.

The config.json inside a ``.keras`` archive gives each layer a dtype policy,
and Keras 3 builds the layer's variables in that policy's variable dtype and
casts the stored values to it on load (``keras.saving.load_model``): a layer
whose policy is ``bfloat16`` over float32 variables loads in bfloat16 (a silent
downcast: an error), ``float32`` over bfloat16 ones loads widened (a warning).
``mixed_float16`` / ``mixed_bfloat16`` build float32 variables, so float32 is
what they should hold.  The reader maps the layers to their h5 groups
(``metadata["keras_layer_dtypes"]``, ``guard.readers.hdf5.keras.layer_policies``).

CG103's fix rewrites config.json's dtype values to the primary set's dtype, as transformers
names it, byte for byte but the values (``guard.rules.dtype_fixes``); ``--to-config`` casts
the weights to the declared dtype instead.  A config that is not valid JSON gets no fix.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.dtypes import display_name as dn
from guard.findings import Finding, Severity, shown
from guard.fixes import Fix, make_fix
from guard.inventory import ConfigDtype, ModelInventory, WeightSet
from guard.rules.dtype_fixes import config_edits, config_params, quantized_no_fix, set_cast_params, set_writes
from guard.rules.dtype_policy import dominant_float, judged_sets, policed_parameters
from guard.tensors import FileScan


def check_config_dtype(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    """CG103 against the primary set only: save_pretrained rewrites config.json, the last save wins."""
    primary = inv.primary
    if inv.config_path is None or primary is None:
        return
    items = inv.config_dtypes()
    weights = dominant_float(inv, primary, policy)
    fix = config_fix(inv, primary, weights, policy) if weights is not None else None
    fix = quantized_no_fix(inv, primary, "CG103") or fix
    yield from (f._replace(fix=fix) for f in _both_keys_disagree(inv, items))
    if weights is None:
        return
    only_dtype = not any(item.key.rsplit(".", 1)[-1] == "torch_dtype" for item in items)
    for item in items:
        if item.value == "auto":
            continue
        code = dtypes.parse_dtype_name(item.value)
        if code is None or code == weights:
            continue
        message = f"config.json {item.key} is {item.value!r} but the weights are {dn(weights)}"
        severity = Severity.warning
        if _narrower(code, weights):
            severity = Severity.error
            message += (f"; transformers v5 loads in the config's dtype by default (dtype=\"auto\"), so loading "
                        f"silently casts the {dn(weights)} weights down to {dn(code)}")
        variant = _variant_holding(inv, code, policy)
        if variant is not None:  # the normal diffusers/transformers workflow: default saved, then the variant
            severity = Severity.warning
            message += (f". It says {item.value}, as the {variant} variant holds; the default weights are "
                        f"{dn(weights)}: the variant was saved last")
        if only_dtype and item.key.rsplit(".", 1)[-1] == "dtype":
            message += " (note: transformers older than 4.56 ignores `dtype` and reads only `torch_dtype`)"
        yield make_finding("CG103", inv.config_path, message, line=item.line)._replace(
            severity=severity, set=primary.name, fix=fix)


def config_fix(inv: ModelInventory, primary: WeightSet, weights: str, policy: Policy) -> Fix | None:
    """Every dtype key of config.json that disagrees with the weights, rewritten to their dtype.

    The edits are the value tokens' exact byte spans: the file keeps its formatting, key order
    and keys (``torch_dtype`` stays ``torch_dtype``) byte for byte but the values.  Both keys are
    rewritten where they disagree with each other too.  ``to_config`` holds the alternative
    (``--to-config``): the weights cast to the dtype the config declares, when it declares one.
    """
    edits = config_edits(inv, weights)
    if not edits or inv.quantization(primary) is not None:
        return None  # a quantized set: its config dtype is the compute dtype (dtype_fixes.quantized_no_fix)
    declared = {str(edit["was"]) for edit in edits}
    keys = sorted({str(edit["key"]) for edit in edits})
    olds = sorted({str(edit["old"]) for edit in edits})
    new = str(edits[0]["new"])
    description = (f"rewrite {', '.join(keys)} in config.json from {' / '.join(olds)} to {new}, the dtype of the "
                   f"primary weights ({dn(weights)}); nothing else in the file changes")
    if len(declared) > 1:
        description += "; its dtype keys disagree with each other, so all are rewritten to the weights' dtype"
    to_config = None
    params = set_cast_params(inv, primary, policy, to=next(iter(declared)),
                             policed=policed_parameters(inv, primary, policy)) if len(declared) == 1 else None
    if params is not None:
        to_config = {"params": {**params, "replace": True}, "writes": list(set_writes(inv, primary)),
                     "description": f"write {primary.name} again in {dn(next(iter(declared)))}, the dtype "
                                    f"config.json declares, replacing it (value-checked when it narrows)"}
    return make_fix("config-dtype", description, writes=(str(inv.config_path),),
                    **config_params(inv, edits, weights), to_config=to_config)


def _both_keys_disagree(inv: ModelInventory, items: list[ConfigDtype]) -> Iterator[Finding]:
    by_prefix: dict[str, dict[str, str]] = defaultdict(dict)
    for item in items:
        prefix, _, key = item.key.rpartition(".")
        by_prefix[prefix][key] = item.value
    for prefix, keys in sorted(by_prefix.items()):
        old, new = keys.get("torch_dtype"), keys.get("dtype")
        if old is None or new is None or dtypes.parse_dtype_name(old) == dtypes.parse_dtype_name(new):
            continue
        where = f"{prefix}." if prefix else ""
        yield make_finding(
            "CG103", inv.config_path or inv.path,
            f"config.json has {where}torch_dtype {old!r} and {where}dtype {new!r}: transformers 4.56 and later "
            f"read `dtype`, older versions `torch_dtype`, so the model loads differently by version")


def _narrower(declared: str, held: str) -> bool:
    a, b = dtypes.DTYPES.get(declared), dtypes.DTYPES.get(held)
    return a is not None and b is not None and a.kind == b.kind == "float" and a.bits < b.bits


def _variant_holding(inv: ModelInventory, code: str, policy: Policy) -> str | None:
    for ws in judged_sets(inv):
        if ws.variant is not None and not ws.primary and dominant_float(inv, ws, policy) == code:
            return ws.variant
    return None


def keras_layer_findings(scan: FileScan, policy: Policy) -> list[Finding]:
    """CG103 per (policy, stored dtype): layers whose stored float variables are not their policy's dtype."""
    import json  # Keras files only

    try:
        layers = json.loads(scan.metadata.get("keras_layer_dtypes", "{}"))
    except ValueError:
        return []
    if not isinstance(layers, dict):
        return []
    prefixes = sorted(layers, key=len, reverse=True)  # a nested model's layers before the model
    groups: dict[tuple[str, str, str], list[tuple[str, str]]] = defaultdict(list)
    for tensor in scan.tensors:
        if not dtypes.is_float(tensor.dtype) or tensor.dtype in dtypes.QUANTIZED_CODES:
            continue
        prefix = next((p for p in prefixes if tensor.name.startswith(p)), None)
        if prefix is None:
            continue
        layer, name, code = layers[prefix]
        if tensor.dtype == code or (tensor.dtype == "F32" and policy.keeps_fp32(tensor.name)):
            continue
        groups[name, code, tensor.dtype].append((layer, tensor.name))
    findings = []
    for (name, code, stored), found in sorted(groups.items()):
        layer, example = found[0]
        named = len({layer for layer, _ in found})
        message = (f"config.json gives {named:,} layer(s) the Keras dtype policy {name!r}, which builds their "
                   f"variables in {dn(code)}, but {len(found):,} stored variable(s) are {dn(stored)}; e.g. layer "
                   f"{shown(layer)} ({shown(example)}). keras.saving.load_model casts them to {dn(code)} on load")
        severity = Severity.error if _narrower(code, stored) else Severity.warning
        if severity is Severity.error:
            message += f": the {dn(stored)} values are silently rounded down"
        findings.append(make_finding("CG103", scan.path, message, tensor=example)._replace(severity=severity))
    return findings
