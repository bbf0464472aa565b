"""Header-level checks, keyed by the codes they produce (see guard.catalogue).

Rules read the inventory and return findings; they never print, raise for a
problem in a checkpoint, or touch bytes.  May import the inventory, config,
catalogue and findings; never the readers' I/O, the report or the CLI.

Checks take the whole inventory and go set by set: CG101-CG106 and CG108 are
judged within one weight set, CG107 across the copies of one model, CG103 on
the primary set, CG109 within a model and across a pipeline's components.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from guard.config import Policy
from guard.findings import Finding
from guard.inventory import ModelInventory
from guard.lazy import resolve
from guard.records import Record
from guard.rules.config_dtype import check_config_dtype
from guard.rules.copies import check_copies_agree
from guard.rules.dtype_policy import check_float64, check_mixed_float_dtypes, check_unexpected_dtype
from guard.rules.formats import check_declared_dtypes
from guard.rules.no_tensors import no_tensor_findings
from guard.rules.norms import check_low_precision_norms
from guard.rules.shards import check_shard_index
from guard.rules.targets import check_target_support
from guard.rules.training import file_findings
from guard.rules.variants import check_variant_dtype, check_variant_shards

Check = Callable[[ModelInventory, Policy], Iterable[Finding]]


class Deferred(Record):
    """A check whose module is imported only for a model it can say something about.

    ``applies`` is a necessary condition of the check's first finding (the sets it would skip, tested
    the way it tests them): a pre-commit hook's plain safetensors commit imports none of these modules.
    ``dotted`` names the check, a ``Check`` (tests/test_architecture.py resolves it and checks its signature).
    """

    applies: Callable[[ModelInventory], bool]
    dotted: str  # "module:function"

    def __call__(self, inventory: ModelInventory, policy: Policy) -> Iterable[Finding]:
        if not self.applies(inventory):
            return ()
        found: Check = resolve(self.dotted)
        return found(inventory, policy)


def _has_torch_set(inventory: ModelInventory) -> bool:
    return any(ws.format == "torch" for ws in inventory.sets)  # check_pickle_only skips every other set


def _has_quantized_set(inventory: ModelInventory) -> bool:
    return any(inventory.quantization(ws) is not None for ws in inventory.sets)  # guard.rules.quantized._each_set


def _names_model_type(inventory: ModelInventory) -> bool:
    config = inventory.config  # guard.rules.loading.applies, without importing it for a bare weight file
    return (isinstance(config, dict) and isinstance(config.get("model_type"), str)
            and isinstance(config.get("architectures"), list))


def _has_token_files(inventory: ModelInventory) -> bool:
    return bool(inventory.token_files)  # guard.rules.eos.applies: a generation config or a tokenizer's files


# Reader-level codes (CG001-CG003, CG005, CG006) come from the readers and the inventory;
# CG007 (and CG001 for a declared count none of which was read) from no_tensor_findings, per file.
CHECKS: tuple[tuple[str, Check | Deferred], ...] = (  # a Deferred is a Check (mypy reads no __call__ on a record)
    ("CG004", check_shard_index),
    ("CG008", Deferred(_has_torch_set, "guard.rules.pickle_only:check_pickle_only")),
    ("CG101", check_unexpected_dtype),
    ("CG102", check_mixed_float_dtypes),
    ("CG103", check_config_dtype),
    ("CG103", check_declared_dtypes),
    ("CG104", check_low_precision_norms),
    ("CG105", check_float64),
    ("CG106", check_target_support),
    ("CG107", check_copies_agree),
    ("CG108", check_variant_dtype),
    ("CG109", check_variant_shards),
    ("CG110", Deferred(_has_quantized_set, "guard.rules.quantized:check_quantized_components")),
    ("CG111", Deferred(_has_quantized_set, "guard.rules.quantized:check_quantized_shapes")),
    ("CG112", Deferred(_has_quantized_set, "guard.rules.quantized:check_quantization_method")),
    ("CG113", Deferred(_has_quantized_set, "guard.rules.quantized:check_quantized_modules")),
    # config groups vs tensors
    ("CG110", Deferred(_has_quantized_set, "guard.rules.quantized_targets:check_targeted_modules")),
    ("CG129", Deferred(_has_quantized_set, "guard.rules.quantized_targets:check_runtime_caveats")),
    # CG123-125, CG127: one judgement per set, shared through its memo
    ("CG123", Deferred(_names_model_type, "guard.rules.loading:check_filled_at_random")),
    ("CG124", Deferred(_names_model_type, "guard.rules.loading:check_dropped")),
    ("CG125", Deferred(_names_model_type, "guard.rules.loading:check_shapes")),
    ("CG126", Deferred(_names_model_type, "guard.rules.loading:check_narrowed_keeps")),
    ("CG127", Deferred(_names_model_type, "guard.rules.loading:check_not_checked")),
    ("CG128", Deferred(_has_token_files, "guard.rules.eos:check_eos_tokens")),  # generation config vs tokenizer
)


def with_kept_modules(inventory: ModelInventory, policy: Policy) -> Policy:
    """keep-fp32 plus the modules transformers keeps in fp32 for config.json's model_type
    (``guard.inventory.keep_fp32``): the rules, and the fixes they plan, leave those fp32 tensors be."""
    config = inventory.config
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not model_type:
        return policy  # a bare weight file (the hook's usual commit) imports no table
    from guard.inventory.keep_fp32 import component_globs, kept_modules

    entries = kept_modules(model_type)
    if not entries:
        return policy
    return policy._replace(keep_fp32=policy.keep_fp32 + component_globs(entries))


def check_model(inventory: ModelInventory, policy: Policy) -> list[Finding]:
    policy = with_kept_modules(inventory, policy)
    findings: list[Finding] = []
    for ws in inventory.sets:
        for scan in ws.files:
            findings.extend(f._replace(set=ws.name) for f in file_findings(ws, scan))
            findings.extend(f._replace(set=ws.name) for f in no_tensor_findings(ws, scan))
    owner = {index.path: ws.name for ws in inventory.sets for index in ws.indexes}
    owner.update((scan.path, ws.name) for ws in inventory.sets for scan in ws.files)
    findings.extend(f._replace(set=owner.get(f.path)) for f in inventory.findings)
    for code, check in CHECKS:
        if policy.is_enabled(code):
            findings.extend(check(inventory, policy))
    return findings
