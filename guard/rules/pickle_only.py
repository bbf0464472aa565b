"""CG008: weights stored only as a torch pickle, with the fix that writes their safetensors copy.

``torch.load`` must unpickle ``pytorch_model.bin`` to load it; a safetensors copy of the
same variant loads without executing anything.  The rule plans the copy
(``guard.fix.actions.safetensors_copy`` writes it): the names transformers', diffusers' and
PEFT's ``save_pretrained`` give it, sharded at save_pretrained's default size.  A set the
copy cannot be made from (a refused global, an unreadable shard, a dtype safetensors cannot
carry) still gets the note, with the reason in place of a fix.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.findings import Finding
from guard.fixes import Fix, make_fix
from guard.inventory import ModelInventory, WeightSet

# The pickled set's stem -> the stem of its safetensors copy (WEIGHTS_NAME -> SAFE_WEIGHTS_NAME, ...)
COPY_STEMS = {"pytorch_model": "model", "model": "model", "diffusion_pytorch_model": "diffusion_pytorch_model",
              "adapter_model": "adapter_model"}
PICKLE_FORMATS = ("torch-zip", "torch-legacy")  # TorchScript and torch.export archives are programs, not state
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # save_pretrained's "5GB"; `fix --max-shard-size` may plan other shards
EXT = ".safetensors"
CONFIG = "config.json"  # read for the model class that names the tied weights


def check_pickle_only(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    copies = {(ws.role, ws.stem, ws.variant) for ws in inv.sets if ws.format == "safetensors"}
    for ws in inv.sets:
        stem = COPY_STEMS.get(ws.stem)
        if (stem is None or ws.format != "torch" or ws.layout not in ("hf", "peft")
                or (ws.role, stem, ws.variant) in copies or not ws.files
                or not all(scan.format in PICKLE_FORMATS or scan.format is None for scan in ws.files)
                or not ws.has_tensors):  # nothing read to copy: CG001 or CG007 says why
            continue
        where = ws.indexes[0].path if ws.indexes else ws.files[0].path
        what = (f"{ws.name} and its {len(ws.files)} shard(s) are stored only as torch pickles" if ws.sharded
                else f"{ws.name} is stored only as a torch pickle")
        finding = make_finding(
            "CG008", where,
            f"{what}: torch.load must unpickle {'them' if ws.sharded else 'it'} to load the weights, while a "
            "safetensors copy loads without executing anything")
        yield finding._replace(set=ws.name, fix=plan_copy(inv, ws, stem))


def plan_copy(inv: ModelInventory, ws: WeightSet, stem: str) -> Fix:
    refused = _refusal(ws)
    if refused:
        return Fix("", f"no safetensors copy can be written: {refused}", "none")
    counted = list(ws.counted_tensors)  # tied names on one storage count once, as the copy holds them once
    names = copy_names(stem, ws.variant, shard_count([t.nbytes or 0 for t in counted], DEFAULT_MAX_SHARD_SIZE))
    folder = posixpath.dirname(ws.files[0].path)
    files = [posixpath.basename(s.path) for s in ws.files]
    index = posixpath.basename(ws.indexes[0].path) if ws.indexes else None
    config = [CONFIG] if inv.config_path and posixpath.dirname(inv.config_path) == folder else []  # tied names
    size = sum(t.nbytes or 0 for t in counted)
    tied = sum(1 for _ in ws.tensors) - len(counted)
    shown_names = names[0] if len(names) == 1 else f"{len(names) - 1} shards and {names[-1]}"
    return make_fix(
        "safetensors-copy",
        f"write {shown_names} beside {ws.name}: its {len(counted):,} tensors ({_size(size)}), copied bit-exactly "
        "from the pickle's bytes without running it" + (f"; {tied} tied name(s) kept once, as save_pretrained "
                                                         "does" if tied else ""),
        writes=tuple(posixpath.join(folder, n) for n in names),
        dir=inv.path, set=ws.name, variant=ws.variant, stem=stem, files=files, index=index, names=names,
        reads=files + ([index] if index else []) + config, max_shard_size=DEFAULT_MAX_SHARD_SIZE,
        tensor_bytes=[t.nbytes or 0 for t in counted],  # so that a plan under --max-shard-size names its shards
    )


def resharded(fix: Fix, max_shard_size: int) -> Fix:
    """The same copy split at another shard size: the file names it writes, as the action will name them."""
    args = fix.arguments
    sizes = args.get("tensor_bytes")
    if args.get("max_shard_size") == max_shard_size or not isinstance(sizes, list):
        return fix
    names = copy_names(str(args["stem"]), args.get("variant"), shard_count([int(n) for n in sizes], max_shard_size))
    folder = posixpath.dirname(fix.writes[0]) if fix.writes else ""
    return fix._replace(writes=tuple(posixpath.join(folder, n) for n in names),
                        params=json.dumps({**args, "names": names, "max_shard_size": max_shard_size}, sort_keys=True))


def _refusal(ws: WeightSet) -> str:
    """Why the set's bytes cannot be carried into safetensors; empty when they can."""
    for scan in ws.files:
        name = posixpath.basename(scan.path)
        codes = {f.code for f in scan.findings}
        if "CG003" in codes:
            return (f"{name}'s pickle references code outside the tensor allowlist (CG003); its tensors are "
                    "not copied from a file that may run code")
        if scan.format is None or codes & {"CG001", "CG005"} or not scan.tensors:
            return f"{name} is not readable as plain tensors ({', '.join(sorted(codes)) or 'no tensors'})"
        if scan.metadata.get("torchao_subclasses"):  # guard.readers.torch: torchao's quantized weights
            return (f"{name} holds torchao tensor subclasses; a plain safetensors copy would keep their components "
                    "without the subclass records transformers needs to load them (save with torchao's own "
                    "safetensors support, or dequantize with `ckpt-guard convert --dequantize`)")
        if scan.metadata.get("torch_quantized_tensors"):
            return (f"{name} holds torch-quantized tensors whose scales only the pickle keeps; safetensors would "
                    "hold bare integers")
    for info in ws.tensors:
        known = dtypes.DTYPES.get(info.dtype)
        if known is None or known.numpy is None or known.bits < 8:
            return (f"{posixpath.basename(info.file)} holds {info.dtype} tensors, which the safetensors copy "
                    "cannot carry")
    if ws.sharded:
        if len(ws.indexes) != 1:
            return f"{ws.name}: its shards stand without exactly one index"
        on_disk = {posixpath.basename(s.path) for s in ws.files}
        listed = set(ws.indexes[0].weight_map.values())
        if not listed or listed != on_disk:
            return f"{ws.name}: the index and the shards on disk disagree (CG004)"
    return ""


def copy_names(stem: str, variant: str | None, count: int) -> list[str]:
    """save_pretrained's names (guard.write.writer.Naming spells them the same way; a test checks)."""
    base = f"{stem}.{variant}" if variant else stem
    if count == 1:
        return [base + EXT]
    return [f"{base}-{i:05d}-of-{count:05d}{EXT}" for i in range(1, count + 1)] + [index_name(stem, variant)]


def index_name(stem: str, variant: str | None) -> str:
    return f"{stem}{EXT}.index{'.' + variant if variant else ''}.json"


def shard_count(sizes: list[int], max_shard_size: int) -> int:
    """Shards of ``guard.write.writer.plan_shards`` (in order, a new one when the next tensor would pass the size)."""
    count, held, size = 1, 0, 0
    for nbytes in sizes:
        if held and size + nbytes > max_shard_size:
            count, held, size = count + 1, 0, 0
        held, size = held + 1, size + nbytes
    return count


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
