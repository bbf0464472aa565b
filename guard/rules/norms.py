"""CG104: normalization parameters stored in half precision, once per weight set."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import compress

from guard.catalogue import make_finding
from guard.config import NORM_PATTERNS, Policy, match_flags
from guard.dtypes import display_name as dn
from guard.findings import Finding, shown
from guard.inventory import ModelInventory
from guard.rules.dtype_policy import judged_sets, spread
from guard.tensors import TENSOR_DTYPE, TENSOR_FILE, TENSOR_NAME, column

_HALVES = ("BF16", "F16")


def check_low_precision_norms(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    for ws in judged_sets(inv):
        if ws.claimed_dtype in _HALVES:
            continue  # a half-precision copy by name: its norms are half precision by design
        groups = ws.by_dtype()
        held = [code for code in _HALVES if code in groups]
        if not held:
            continue
        # the half-precision tensors in file order: the first norm is the example; with one half dtype
        # (the common case) its group is already in file order and holds nothing else
        tensors = groups[held[0]] if len(held) == 1 else [t for t in ws.tensors if t.dtype in _HALVES]
        # read from the columns, in C (compress, sum): a sharded set's norms are tens of thousands, and no record is
        # made for them; a Python loop over the flags cost 37 M instructions of a 50,000-tensor scan (+4 %, callgrind)
        flags = match_flags(NORM_PATTERNS, list(column(TENSOR_NAME, tensors)))
        count = sum(flags)
        if not count:
            continue
        # One finding for the set, on the first file holding a norm: one per shard made a sharded
        # model's report as long as its shard list, saying the same thing 4,000 times.
        files = sorted(set(compress(column(TENSOR_FILE, tensors), flags)))
        example = next(name for name, file in compress(zip(column(TENSOR_NAME, tensors), column(TENSOR_FILE, tensors)),
                                                       flags) if file == files[0])
        kinds = "/".join(sorted({dn(code) for code in set(compress(column(TENSOR_DTYPE, tensors), flags))}))
        yield make_finding(
            "CG104", files[0],
            f"{count} normalization parameter(s){spread(files, ws)} stored in {kinds}; "
            f"e.g. {shown(example)}. Many recipes keep norms in fp32",
            tensor=example,
        )._replace(set=ws.name)
