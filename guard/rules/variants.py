"""CG108 and CG109: variants and names that claim a dtype, and variants half present.

A variant named for a dtype (``fp16``) is expected to hold it; so is any file
whose name claims one (``model_fp16.onnx``).  A variant must be whole:
``from_pretrained(variant="fp16")`` fails when a shard stands without its index,
or (across a diffusers pipeline) when a component that has weights lacks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from guard.catalogue import make_finding
from guard.config import Policy
from guard.dtypes import display_name as dn
from guard.findings import Finding
from guard.inventory import ModelInventory, is_weight_file
from guard.inventory.conventions import DTYPE_VARIANTS
from guard.inventory.names import classify
from guard.inventory.pipelines import Pipeline
from guard.rules.dtype_policy import dominant_float, judged_sets


def check_variant_dtype(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        if ws.claimed_dtype is None or inv.quantization(ws) is not None:
            continue
        held = dominant_float(inv, ws, policy)
        if held is None or held == ws.claimed_dtype:
            continue
        what = f"the {ws.variant} variant" if ws.variant else "its name"
        first = next((t for t in ws.tensors if t.dtype == held), None)
        yield make_finding(
            "CG108", first.file if first else ws.files[0].path,
            f"{ws.name}: {what} claims {dn(ws.claimed_dtype)} but its floating weights are {dn(held)}",
            tensor=first.name if first else None,
        )._replace(set=ws.name)


def check_variant_shards(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        numbered = [scan for scan in ws.files if classify(scan.path).shard is not None]
        if ws.variant is None or ws.indexes or not numbered:
            continue
        yield make_finding(
            "CG109", numbered[0].path,
            f"{len(numbered)} shard(s) of the {ws.variant} variant ({ws.name}) stand without their index: "
            f"from_pretrained(variant={ws.variant!r}) cannot load them",
        )._replace(set=ws.name)


def check_pipeline(pipeline: Pipeline) -> Iterator[Finding]:
    """CG109 across components: every component with weights must carry each dtype variant.

    Variants that are not dtypes (ema, non_ema) exist only for the components that
    were trained, so they are not required everywhere.
    """
    variants: dict[str, dict[str, str]] = {}  # component -> {variant: an example file}
    for component, names in pipeline.components.items():
        found: dict[str, str] = {}
        for name in names:
            role = classify(name)
            if is_weight_file(name) and role.role == "weights" and role.variant and role.variant_dtype:
                found.setdefault(role.variant, name)
        if any(is_weight_file(n) and classify(n).role == "weights" for n in names):
            variants[component] = found
    wanted = sorted({v for found in variants.values() for v in found})
    for variant in wanted:
        have = sorted(c for c, found in variants.items() if variant in found)
        for component in sorted(set(variants) - set(have)):
            example = variants[have[0]][variant]
            yield make_finding(
                "CG109", f"{pipeline.path}/{component}",
                f"{component} has no {variant} variant, while {_listed(have)} do (e.g. {have[0]}/{example}): "
                f"DiffusionPipeline.from_pretrained(variant={variant!r}) mixes {dn(DTYPE_VARIANTS[variant.lower()])} "
                f"and default weights, and {component}'s own from_pretrained(variant={variant!r}) fails",
            )


def _listed(names: Iterable[str]) -> str:
    items = list(names)
    return ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")
