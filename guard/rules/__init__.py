"""Header-level checks, keyed by the codes they produce (see guard.catalogue)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from guard.config import Policy
from guard.findings import Finding
from guard.inventory import ModelInventory
from guard.rules.dtype_policy import (
    check_config_dtype,
    check_float64,
    check_low_precision_norms,
    check_mixed_float_dtypes,
    check_unexpected_dtype,
)
from guard.rules.formats import check_gguf_file_type, check_name_claimed_dtype
from guard.rules.shards import check_shard_index
from guard.rules.targets import check_target_support

Check = Callable[[ModelInventory, Policy], Iterable[Finding]]

# Reader-level codes (CG001-CG003, CG005) come from the readers themselves.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("CG004", check_shard_index),
    ("CG101", check_unexpected_dtype),
    ("CG102", check_mixed_float_dtypes),
    ("CG103", check_config_dtype),
    ("CG103", check_gguf_file_type),
    ("CG104", check_low_precision_norms),
    ("CG105", check_float64),
    ("CG106", check_target_support),
    ("CG108", check_name_claimed_dtype),
)


def check_model(inventory: ModelInventory, policy: Policy) -> list[Finding]:
    findings = list(inventory.file_findings())
    for code, check in CHECKS:
        if policy.is_enabled(code):
            findings.extend(check(inventory, policy))
    return findings
