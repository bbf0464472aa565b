"""CG108 and CG109: variants and names that claim a dtype, and variants half present.

A variant named for a dtype (``fp16``) is expected to hold it; so is any file
whose name claims one (``model_fp16.onnx``).  A variant must be whole:
``from_pretrained(variant="fp16")`` fails when a shard stands without its index,
or (across a diffusers pipeline) when a component that has weights lacks it.

Each finding carries its fix (``guard.fix.actions``): CG108 recasts the variant under its
own names (it replaces the files: ``--replace``); CG109 writes the missing index from the
shards' headers, or the component's missing variant cast from its default set.  Both only
add files, so they are safe.  The pipeline fix is planned from file names alone, as the
check is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.dtypes import display_name as dn
from guard.errors import GuardError
from guard.findings import Finding
from guard.fixes import Fix, make_fix, no_fix
from guard.inventory import ModelInventory, WeightSet, is_weight_file
from guard.inventory.conventions import DTYPE_VARIANTS
from guard.inventory.names import FileRole, classify, convention_of
from guard.inventory.pipelines import Pipeline
from guard.rules.dtype_policy import dominant_float, judged_sets, relative


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
        )._replace(set=ws.name, fix=_recast_fix(inv, ws, held))


def check_variant_shards(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        numbered = [scan for scan in ws.files if classify(scan.path, weights=True).shard is not None]
        if ws.variant is None or ws.indexes or not numbered:
            continue
        yield make_finding(
            "CG109", numbered[0].path,
            f"{len(numbered)} shard(s) of the {ws.variant} variant ({ws.name}) stand without their index: "
            f"from_pretrained(variant={ws.variant!r}) cannot load them",
        )._replace(set=ws.name, fix=_index_fix(inv, ws, [scan.path for scan in numbered]))


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
            )._replace(fix=_variant_add_fix(f"{pipeline.path}/{component}", pipeline.components[component], variant))


def _listed(names: Iterable[str]) -> str:
    items = list(names)
    return ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")


# The index convention that goes with each variant shard convention (guard.inventory.conventions).
_SHARD_INDEXES: dict[str | None, str] = {  # a convention with no template looks up None: no row
    "{stem}.{variant}-{shard}.{ext}": "{stem}.{ext}.index.{variant}.json",  # save_pretrained(variant=)
    "{stem}-{shard}.{variant}.{ext}": "{stem}.{ext}.{variant}.index.json",  # diffusers, deprecated
}
_CASTABLE = ("safetensors", "torch")  # default sets a variant can be cast from (no Flax yet)
# The stem of a default set -> the stem of its safetensors variant (transformers renames the .bin's).
SAFETENSORS_STEMS = {"model": "model", "pytorch_model": "model", "diffusion_pytorch_model": "diffusion_pytorch_model"}
_VARIANT_FILE, _VARIANT_SHARD = "{stem}.{variant}.{ext}", "{stem}.{variant}-{shard}.{ext}"


def variant_file_names(default_names: list[str] | tuple[str, ...], variant: str) -> list[str]:
    """What variant-add writes for a default set (names relative to its directory): the safetensors
    variant, one shard per default shard and then their index, as save_pretrained(variant=) names them."""
    weights = sorted(n for n in default_names if classify(n).kind != "index")
    stem = SAFETENSORS_STEMS.get(classify(weights[0]).stem) if weights else None
    if stem is None:
        raise GuardError(f"{', '.join(default_names)}: not a default set a variant can be cast from")
    if len(weights) == 1:
        return [_VARIANT_FILE.format(stem=stem, variant=variant, ext="safetensors")]
    count = len(weights)
    return [_VARIANT_SHARD.format(stem=stem, variant=variant, shard=f"{k:05d}-of-{count:05d}", ext="safetensors")
            for k in range(1, count + 1)] + [_SHARD_INDEXES[_VARIANT_SHARD].format(stem=stem, variant=variant,
                                                                                   ext="safetensors")]


def _recast_fix(inv: ModelInventory, ws: WeightSet, held: str) -> Fix:
    to = ws.claimed_dtype
    assert to is not None
    if ws.format != "safetensors":
        return no_fix("CG108", f"{ws.name} is {ws.format or 'an unknown format'}; only safetensors sets are "
                               f"recast in place: re-save it with save_pretrained(variant={ws.variant!r})")
    files = [relative(inv.path, s.path) for s in ws.files]
    index = [relative(inv.path, i.path) for i in ws.indexes]
    names = files + index
    return make_fix(
        "variant-recast", f"recast {ws.name} from {dn(held)} to the {dn(to)} its name claims (value-checked; "
                          "the old files kept as NAME.orig)",
        safety="needs-flag", flag="--replace", writes=tuple(f"{inv.path}/{n}" for n in names),
        dir=inv.path, set=ws.name, variant=ws.variant, to=to, reads=names, files=files,
        index=index[0] if index else None,
        bytes=sum((dtypes.nbytes(to, t.numel) if dtypes.is_float(t.dtype) and t.dtype not in dtypes.QUANTIZED_CODES
                   else t.nbytes) or 0 for t in ws.counted_tensors))


def _index_fix(inv: ModelInventory, ws: WeightSet, shards: list[str]) -> Fix:
    names = sorted(relative(inv.path, path) for path in shards)
    roles = [classify(name) for name in names]
    totals = {role.shard[1] for role in roles if role.shard}
    numbers = sorted(role.shard[0] for role in roles if role.shard)
    if len(totals) != 1 or numbers != list(range(1, max(totals) + 1)):
        total = max(totals) if totals else 0
        missing = sorted(set(range(1, total + 1)) - set(numbers))
        return no_fix("CG109", f"shard(s) {', '.join(map(str, missing[:5])) or '?'} of {total} are missing, so no "
                               "index can list their tensors: re-save the variant")
    index = _index_name(roles)
    if index is None:
        return no_fix("CG109", "the shards are not named by one save_pretrained convention: re-save the variant")
    return make_fix(
        "index-rebuild", f"write {index} from the headers of its {len(names)} shard(s)",
        writes=(f"{inv.path}/{index}",), dir=inv.path, set=ws.name, variant=ws.variant, reads=names, index=index)


def _index_name(roles: list[FileRole]) -> str | None:
    templates = {getattr(convention_of(role.name), "template", None) for role in roles}
    names = {(role.stem, role.name.rpartition(".")[2], role.variant) for role in roles}
    template = _SHARD_INDEXES.get(templates.pop()) if len(templates) == 1 else None
    if template is None or len(names) != 1:
        return None
    stem, ext, variant = names.pop()
    return template.format(stem=stem, ext=ext, variant=variant)


def plan_variant_add(inv: ModelInventory, variant: str) -> Fix:
    """The variant-add fix for one model directory (``fix --add variant:fp16``), from its default set."""
    names = tuple(relative(inv.path, f.path) for f in inv.files) + tuple(relative(inv.path, i.path)
                                                                          for i in inv.indexes)
    return _variant_add_fix(inv.path, names, variant)


def _variant_add_fix(directory: str, names: tuple[str, ...], variant: str) -> Fix:
    if variant.lower() not in DTYPE_VARIANTS:
        return no_fix("CG109", f"{variant!r} names no dtype, so there is nothing to cast to")
    reads = _default_set(names)
    if not reads:
        return no_fix("CG109", "the component has no safetensors or PyTorch default weights to cast the variant "
                               f"from: save it with save_pretrained(variant={variant!r})")
    to = DTYPE_VARIANTS[variant.lower()]
    try:
        written = variant_file_names(reads, variant)
    except GuardError as exc:
        return no_fix("CG109", f"{exc}: save it with save_pretrained(variant={variant!r})")
    return make_fix(
        "variant-add", f"write {', '.join(written)}: the {variant} variant, cast to {dn(to)} from "
                       f"{', '.join(reads)} (value-checked)",
        writes=tuple(f"{directory}/{n}" for n in written), dir=directory, variant=variant, to=to, reads=reads)


def _default_set(names: tuple[str, ...]) -> list[str]:
    """The component's default weights by name: one file, or an index and its shards; safetensors first."""
    found: dict[tuple[str, str], dict[str, list[str]]] = {}
    for name in names:
        role = classify(name)
        if role.role != "weights" or role.layout != "hf" or role.variant is not None or role.format not in _CASTABLE:
            continue
        found.setdefault((role.format, role.stem), {}).setdefault(role.kind, []).append(name)
    for fmt in _CASTABLE:
        for (family, _stem), kinds in sorted(found.items()):
            if family != fmt:
                continue
            if len(kinds.get("file", ())) == 1:
                return kinds["file"]
            if len(kinds.get("index", ())) == 1 and kinds.get("shard"):
                return kinds["index"] + sorted(kinds["shard"])
    return []
