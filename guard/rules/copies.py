"""CG107: copies of one model that should hold the same weights, and do not.

Format copies of one variant (safetensors, PyTorch, Flax, TF, the original
layout) must agree on dtypes, weighted by parameters: bart-large's fp16 PyTorch
weights beside an fp32 Flax copy is this, not a mix within one model.  Where
two sets share a naming scheme (safetensors and ``.bin``; a default and a
non-dtype variant of one format) their tensor names and shapes must agree too,
allowing for the tied aliases that ``.bin`` keeps and safetensors drops.
Each copy is compared with its group's reference (the primary, or the
best-ranked set of that variant), so n copies give at most n - 1 findings.
Under ``--values`` the copies that agree here are compared value by value too
(``guard.values.copies``).

The fix (STYLE rule 14): regenerate the copy from its reference through convert,
bit-exactly ("copy-regenerate", needs ``--replace``), where convert can write the
copy's format from the reference's; ``plan_add_copy`` plans ``fix --add``.
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Iterator

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.dtypes import display_name as dn
from guard.findings import Finding, shown
from guard.fixes import Fix, make_fix, no_fix
from guard.inventory import ModelInventory, WeightSet
from guard.inventory.sets import choose_primary
from guard.tensors import TensorInfo

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (the hook's path)
if TYPE_CHECKING:
    from typing import TypedDict

    class AddCopyParams(TypedDict):
        """The ``add-copy`` action's params (guard.fix.actions), beside make_fix's own fields."""

        dir: str
        what: str
        primary: str
        reads: list[str]

COPY_LAYOUTS = ("hf", "original", "fsdp")  # one model's copies; loose files and exports are their own
PYTORCH_NAMES = ("safetensors", "torch")  # formats that keep PyTorch's state-dict names
SHARE_TOLERANCE = 0.01  # of the floating parameters
_SAMPLE = 3


def check_copies_agree(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    copies = _copies(inv)
    for reference, ws in _pairs(copies):
        found = list(_dtypes_disagree(reference, ws))
        if ws.format in PYTORCH_NAMES and reference.format in PYTORCH_NAMES and ws.layout == reference.layout:
            found += _names_disagree(reference, ws)
        if found:
            fix = regenerate_fix(inv, reference, ws)
            yield from (f._replace(fix=fix) for f in found)
    default = next((ws for ws in copies if ws.variant is None and ws.primary), None)
    if default is None:
        return
    for ws in copies:
        if ws.variant is not None and ws.variant_dtype is None and ws.format == default.format \
                and ws.layout == default.layout:
            own = no_fix("CG107", f"the {ws.variant!r} variant holds weights of its own, which regenerating it "
                                  f"from {default.name} would lose: re-save it with save_pretrained(variant=)")
            yield from (f._replace(fix=own) for f in _names_disagree(default, ws))


def _copies(inv: ModelInventory) -> list[WeightSet]:
    return [ws for ws in inv.sets if ws.role == "weights" and ws.layout in COPY_LAYOUTS
            and ws.has_tensors and inv.quantization(ws) is None]


def copy_pairs(inv: ModelInventory) -> Iterator[tuple[WeightSet, WeightSet]]:
    """(reference, copy) for every copy of a variant: the sets whose dtypes, names and values must agree."""
    return _pairs(_copies(inv))


def _pairs(copies: list[WeightSet]) -> Iterator[tuple[WeightSet, WeightSet]]:
    by_variant: dict[str | None, list[WeightSet]] = defaultdict(list)
    for ws in copies:
        by_variant[ws.variant].append(ws)
    for group in by_variant.values():
        # the primary, else the best-ranked set of the variant (safetensors, then PyTorch, then Flax)
        reference = next((ws for ws in group if ws.primary), None) or choose_primary(group, diffusers=False)
        assert reference is not None  # a group is never empty
        yield from ((reference, ws) for ws in group if ws is not reference)


def _shares(ws: WeightSet) -> dict[str, float]:
    totals = {code: n for code, n in ws.parameters_by_dtype().items() if dtypes.is_float(code)}
    whole = sum(totals.values()) or 1
    return {code: n / whole for code, n in totals.items()}


def _dtypes_disagree(reference: WeightSet, ws: WeightSet) -> Iterator[Finding]:
    ref, other = _shares(reference), _shares(ws)
    if not ref or not other:
        return
    gap = max(abs(ref.get(code, 0.0) - other.get(code, 0.0)) for code in set(ref) | set(other))
    if max(ref, key=ref.__getitem__) == max(other, key=other.__getitem__) and gap <= SHARE_TOLERANCE:
        return
    yield make_finding(
        "CG107", ws.files[0].path,
        f"{ws.name} holds {_describe(other)} but {reference.name} holds {_describe(ref)}: two copies of one "
        f"model disagree, so the weights a user gets depend on which copy their library loads",
    )._replace(set=ws.name)


def _describe(shares: dict[str, float]) -> str:
    ranked = sorted(shares.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{dn(code)} {share:.1%}" for code, share in ranked[:3])


def _names_disagree(reference: WeightSet, ws: WeightSet) -> Iterator[Finding]:
    ref, other = _floats(reference), _floats(ws)
    ref_storages, other_storages = _storages(reference), _storages(ws)  # once, not once per name
    only_ref = sorted(n for n in set(ref) - set(other) if not _tied_alias(ref[n], ref_storages, other))
    only_other = sorted(n for n in set(other) - set(ref) if not _tied_alias(other[n], other_storages, ref))
    reshaped = sorted(n for n in set(ref) & set(other) if ref[n].shape != other[n].shape)
    problems = []
    if only_other:
        problems.append(f"{len(only_other)} tensor(s) only in {ws.name} ({_sample(only_other)})")
    if only_ref:
        problems.append(f"{len(only_ref)} only in {reference.name} ({_sample(only_ref)})")
    if reshaped:
        first = reshaped[0]
        problems.append(f"{len(reshaped)} with other shapes (e.g. {shown(first)}: {list(other[first].shape)} "
                        f"against {list(ref[first].shape)})")
    if problems:
        example = (only_other or reshaped or only_ref)[0]
        yield make_finding("CG107", ws.files[0].path,
                           f"{ws.name} and {reference.name} should hold the same tensors: " + "; ".join(problems),
                           tensor=example)._replace(set=ws.name)


def _floats(ws: WeightSet) -> dict[str, TensorInfo]:
    return {t.name: t for t in ws.tensors if dtypes.is_float(t.dtype)}


def _storages(ws: WeightSet) -> dict[tuple[str, str], list[str]]:
    names: dict[tuple[str, str], list[str]] = defaultdict(list)
    for tensor in ws.tensors:
        if tensor.storage is not None:
            names[(tensor.file, tensor.storage)].append(tensor.name)
    return names


def _tied_alias(tensor: TensorInfo, storages: dict[tuple[str, str], list[str]],
                other: dict[str, TensorInfo]) -> bool:
    """A .bin keeps tied weights as two names on one storage; safetensors keeps one of them."""
    if tensor.storage is None:
        return False
    return any(name != tensor.name and name in other for name in storages.get((tensor.file, tensor.storage), ()))


def _sample(names: list[str]) -> str:
    return ", ".join(shown(n) for n in names[:_SAMPLE]) + (f" and {len(names) - _SAMPLE} more"
                                                           if len(names) > _SAMPLE else "")


# --- fixes -------------------------------------------------------------------------------------------

# What convert writes, by the stale copy's format: (convert's --to, its layout, the file stem it names).
CONVERT_WRITES = {"flax": ("flax", "msgpack", "flax_model"), "safetensors": ("torch", "safetensors", "model")}
CONVERT_READS = {"flax": ("safetensors", "torch"), "torch": ("flax",)}  # by --to, in the order convert picks
CONVERT_STEMS = ("model", "pytorch_model", "flax_model")
ADD_WHATS = ("flax", "orbax", "safetensors", "variant:fp16", "variant:bf16")
ORBAX_DIR = "orbax"  # where `fix --add orbax` puts the checkpoint: a directory of its own inside the model's


def relative(path: str, directory: str) -> str:
    """A display path relative to the model directory's display path (params name files so)."""
    prefix = directory.rstrip("/") + "/"
    if directory in ("", "."):
        return path
    return path[len(prefix):] if path.startswith(prefix) else posixpath.basename(path)


def set_files(ws: WeightSet, directory: str) -> list[str]:
    """The set's files and its index, relative to ``directory``."""
    return sorted({relative(f.path, directory) for f in ws.files} | {relative(i.path, directory) for i in ws.indexes})


def _reads(inv: ModelInventory, ws: WeightSet) -> list[str]:
    """What convert reads from the reference: its files, and config.json for the name mapping."""
    extra = [relative(inv.config_path, inv.path)] if inv.config_path else []
    return sorted(set(set_files(ws, inv.path) + extra))


def _convert_source(inv: ModelInventory, to: str, variant: str | None) -> WeightSet | None:
    """The set convert reads for ``to`` (guard.convert.read.source.choose_layout picks by the same names)."""
    for fmt in CONVERT_READS[to]:
        found = next((ws for ws in inv.sets if ws.role == "weights" and ws.layout == "hf" and ws.format == fmt
                      and ws.variant == variant and ws.stem in CONVERT_STEMS), None)
        if found is not None:
            return found
    return None


def regenerate_fix(inv: ModelInventory, reference: WeightSet, stale: WeightSet) -> Fix:
    """CG107's fix: ``stale`` rewritten from ``reference`` by convert, bit-exactly; or why there is none."""
    writes = CONVERT_WRITES.get(stale.format)
    if writes is None or stale.layout != "hf" or stale.stem != writes[2]:
        return no_fix("CG107", f"convert writes no {stale.name}: re-save it from {reference.name} with the library "
                               f"that wrote it, or delete it")
    to, layout, _stem = writes
    if to == "torch" and reference.format == "torch":
        return no_fix("CG107", f"{stale.name} would be written from the pickle {reference.name}, which is "
                               f"CG008's fix: delete {stale.name}, then `ckpt-guard fix --write` writes it again")
    if _convert_source(inv, to, stale.variant) is not reference:
        return no_fix("CG107", f"convert would read another set than {reference.name}: re-save {stale.name} "
                               f"from it with the library that wrote it, or delete it")
    files = set_files(stale, inv.path)
    return make_fix(
        "copy-regenerate", f"regenerate {stale.name} from {reference.name} through convert, bit-exactly "
                           f"(replaces {', '.join(files)}; the old files are kept as NAME.orig)",
        safety="needs-flag", flag="--replace", writes=tuple(f"{inv.path}/{name}" for name in files),
        dir=inv.path, stale=stale.name, primary=reference.name, to=to, layout=layout,
        reads=_reads(inv, reference), files=files)


def plan_add_copy(inv: ModelInventory, what: str) -> Fix:
    """``fix --add WHAT``: the copy the model lacks, from its primary set; or why it cannot be added."""
    primary = inv.primary
    if what not in ADD_WHATS:
        return no_fix("CG107", f"--add {what[:40]!r}: choose one of {', '.join(ADD_WHATS)}")
    if primary is None or primary.role != "weights":
        return no_fix("CG107", f"--add {what}: {inv.path} has no weights to make a copy from")
    if primary.format == "orbax":  # fix --add orbax puts one inside the model it was made from: add copies there
        return no_fix("CG107", f"--add {what}: {inv.path} is an Orbax checkpoint; copies are added beside the "
                               "model's own weights, not inside a checkpoint")
    if primary.layout != "hf" or primary.format not in CONVERT_READS["flax"] + CONVERT_READS["torch"]:
        return no_fix("CG107", f"--add {what}: {primary.name} is not a transformers-named safetensors, PyTorch "
                               "or Flax set, which is what copies are made from")
    held = [ws for ws in inv.sets if ws.role == "weights" and ws.variant is None]
    params: AddCopyParams = {"dir": inv.path, "what": what, "primary": primary.name, "reads": _reads(inv, primary)}
    if what.startswith("variant:"):  # CG109's own fix writes it (guard.fix.actions.cast)
        from guard.rules.variants import plan_variant_add

        variant = what.partition(":")[2]
        if any(ws.variant == variant for ws in inv.sets):
            return no_fix("CG107", f"--add {what}: {inv.path} already has the {variant} variant")
        return _delegated(plan_variant_add(inv, variant), what, params)
    if primary.stem not in CONVERT_STEMS and not (what == "safetensors" and primary.format == "torch"):
        return no_fix("CG107", f"--add {what}: convert reads transformers' model / pytorch_model / flax_model "
                               f"weights, not {primary.name}")
    if what == "orbax":  # an ORBAX_DIR already there is refused when staged (planning reads no directories)
        return make_fix("add-copy", f"add an Orbax checkpoint of {primary.name} in {ORBAX_DIR}/, through convert, "
                                    "bit-exactly", writes=(f"{inv.path}/{ORBAX_DIR}",), **params)
    fmt = "flax" if what == "flax" else "safetensors"
    existing = next((ws for ws in held if ws.format == fmt), None)
    if existing is not None:
        return no_fix("CG107", f"--add {what}: {inv.path} already has {existing.name}"
                               + ("; regenerate a stale one with `fix --values --replace`" if fmt == "flax" else ""))
    if fmt == "safetensors" and primary.format == "torch":  # CG008's own fix writes it (safetensors_copy)
        from guard.rules.pickle_only import COPY_STEMS, plan_copy

        stem = COPY_STEMS.get(primary.stem)
        if stem is None:
            return no_fix("CG107", f"--add safetensors: {primary.name} is not a set save_pretrained names")
        return _delegated(plan_copy(inv, primary, stem), what, params)
    name = "flax_model.msgpack" if fmt == "flax" else "model.safetensors"
    return make_fix("add-copy", f"add {name} (or shards and their index) from {primary.name}, through convert, "
                                "bit-exactly", writes=(f"{inv.path}/{name}",), **params)


def _delegated(planned: Fix, what: str, params: AddCopyParams) -> Fix:
    """An --add request that another fix already knows how to write: its description and files, as add-copy."""
    if not planned.available:
        return no_fix("CG107", f"--add {what}: {planned.description}")
    return make_fix("add-copy", planned.description, writes=planned.writes, **params)
