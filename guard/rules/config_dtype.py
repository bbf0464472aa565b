"""CG103: config.json's declared dtype against the primary set.

save_pretrained rewrites config.json on every save, so the last save wins: a
config that matches a variant rather than the default weights says so.
transformers v5 loads in the declared dtype by default, so a config narrower
than the weights is a silent downcast (an error); the other way is a warning.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.dtypes import display_name as dn
from guard.findings import Finding, Severity
from guard.inventory import ConfigDtype, ModelInventory
from guard.rules.dtype_policy import dominant_float, judged_sets


def check_config_dtype(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    """CG103 against the primary set only: save_pretrained rewrites config.json, the last save wins."""
    primary = inv.primary
    if inv.config_path is None or primary is None:
        return
    items = inv.config_dtypes()
    yield from _both_keys_disagree(inv, items)
    weights = dominant_float(inv, primary, policy)
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
            severity=severity, set=primary.name)


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
