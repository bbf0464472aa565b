"""Every parameter a library holds against the file it loaded it from, bit for bit.

The file's tensor goes through the target's mapping (``guard.targets.table``, its steps interpreted by
``guard.convert.steps``); then:
- same dtype: the bytes must be equal;
- a wider dtype holding exactly the file's values (keras-hub's float32 policy on a bf16 file):
  recorded as widened, not a finding;
- anything else is CG302: rounded (the library's dtype is narrower and holds the file's values
  rounded to it), reinterpreted (the file's bits read as another dtype) or changed;
- a file tensor the mapping has no place for, a place the library does not hold, a shape other
  than the mapping's, or a parameter the library holds that no file tensor fills: CG304.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from guard.against.targets import Target, head_dim
from guard.catalogue import make_finding
from guard.findings import Finding


def expected_tree(target: Target, config: dict[str, Any], file_names: Any,
                  ) -> tuple[dict[str, tuple[str, tuple[str, ...]]], list[str]]:
    """library name -> (file name, the mapping's steps); and the file names with no place."""
    rows = target.mapping[config["model_type"]]
    placed: dict[str, tuple[str, tuple[str, ...]]] = {}
    unplaced = []
    for name in sorted(file_names):
        row = next(((m, r) for r in rows if (m := re.fullmatch(r[0], name))), None)
        if row is None:
            unplaced.append(name)
            continue
        match, (_, template, steps) = row
        placed[template.format(i=match.group(1) if match.groups() else "")] = (name, steps)
    return placed, unplaced


def apply_steps(array: Any, steps: tuple[str, ...], config: dict[str, Any]) -> Any:
    """The file's array as the library holds it: the mapping's steps (transposes and reshapes), nothing else."""
    from guard.convert.steps import to_target

    return to_target(array, steps, head_dim(config))


def compare_tree(target: Target, load_label: str, avoid: str | None, config: dict[str, Any],
                 file_tensors: Mapping[str, Callable[[], Any]], held: Mapping[str, Callable[[], Any]], *, where: str,
                 ) -> tuple[list[Finding], dict[str, Any]]:
    """``file_tensors``/``held``: name -> a reader of the file's / the library's array (one pair in memory at a
    time); ``avoid``: the option that avoids a finding under this load."""
    placed, unplaced = expected_tree(target, config, file_tensors)
    expected = {lib_name: (file_name, partial(_mapped, file_tensors[file_name], steps, config))
                for lib_name, (file_name, steps) in placed.items()}
    return compare_held(target, load_label, avoid, expected, unplaced, held, where=where)


def _mapped(read: Callable[[], Any], steps: tuple[str, ...], config: dict[str, Any]) -> Any:
    return apply_steps(read(), steps, config)


def compare_held(target: Target, load_label: str, avoid: str | None,
                 expected: Mapping[str, tuple[str, Callable[[], Any]]], unplaced: list[str],
                 held: Mapping[str, Callable[[], Any]], *, where: str) -> tuple[list[Finding], dict[str, Any]]:
    """``expected``: library name -> (the file tensor it comes from, a reader of the file's array(s) after the
    mapping); every placed name against what the library holds, and what it holds beyond them."""
    who = f"{target.name} {target.version} ({load_label})"
    hint = f"; {avoid} avoids it" if avoid else ""
    findings: list[Finding] = []
    figures: dict[str, Any] = {"exact": 0, "widened": [], "changed": [], "missing": [], "extra": [],
                               "unplaced": unplaced}
    for name in unplaced:
        findings.append(make_finding("CG304", where, f"{who}: the file's {name!r} has no place in its tree "
                                                     f"(mapping: {target.cites})", tensor=name))
    for lib_name, (file_name, read_expected) in sorted(expected.items()):
        if lib_name not in held:
            figures["missing"].append(lib_name)
            findings.append(make_finding("CG304", where, f"{who} holds no {lib_name!r} for {file_name!r}",
                                         tensor=file_name))
            continue
        verdict = judge_one(read_expected(), held[lib_name]())
        if verdict is None:
            figures["exact"] += 1
        elif verdict.startswith("widened"):
            figures["widened"].append(file_name)
        else:
            figures["changed"].append({"tensor": file_name, "library_name": lib_name, "what": verdict})
            code = "CG304" if verdict.startswith("shape") else "CG302"
            findings.append(make_finding(code, where, f"{who}: {lib_name!r} {verdict}{hint}", tensor=file_name))
    for lib_name in sorted(set(held) - set(expected)):
        figures["extra"].append(lib_name)
        findings.append(make_finding("CG304", where, f"{who} holds {lib_name!r}, which no tensor of the file fills "
                                                     "(left as initialised)"))
    return findings, figures


def judge_one(expected: Any, held: Any) -> str | None:
    """None when bit-exact; else what happened, in words (``widened`` is exact and not a finding)."""
    import numpy as np

    if tuple(expected.shape) != tuple(held.shape):
        return f"shape {list(held.shape)} where the mapping gives {list(expected.shape)}"
    file_dtype, lib_dtype = expected.dtype, held.dtype
    total = expected.size
    if file_dtype == lib_dtype:
        same = expected.view(_bits(file_dtype)) == held.view(_bits(file_dtype))
        changed = int(total - np.count_nonzero(same))
        if changed == 0:
            return None
        through = _rounded_through(expected, held)
        how = f"rounded through {through}: " if through else ""
        return f"{how}{changed} of {total} elements differ from the file's bits"
    widened = held.astype(np.float64)
    original = expected.astype(np.float64)
    if lib_dtype.itemsize > file_dtype.itemsize and np.array_equal(widened, original, equal_nan=True):
        return f"widened {file_dtype.name} -> {lib_dtype.name}, exact"
    if lib_dtype.itemsize == file_dtype.itemsize and np.array_equal(expected.view(_bits(file_dtype)),
                                                                    held.view(_bits(lib_dtype))):
        return (f"reinterpreted: the file's {file_dtype.name} bits read as {lib_dtype.name} "
                f"(max |change| {_max_change(original, widened):.3g})")
    changed = int(np.count_nonzero(~((original == widened) | (np.isnan(original) & np.isnan(widened)))))
    rounded = np.array_equal(expected.astype(lib_dtype).astype(np.float64), widened, equal_nan=True)
    what = f"rounded {file_dtype.name} -> {lib_dtype.name}" if rounded else f"{file_dtype.name} -> {lib_dtype.name}"
    return f"{what}: {changed} of {total} elements changed (max |change| {_max_change(original, widened):.3g})"


def _rounded_through(expected: Any, held: Any) -> str | None:
    """The narrower float the library's copy went through (EasyDeL's default load: float16), if any."""
    import ml_dtypes
    import numpy as np

    for narrow in (np.float16, ml_dtypes.bfloat16):
        if np.dtype(narrow).itemsize < expected.dtype.itemsize and np.array_equal(
                expected.astype(narrow).astype(held.dtype), held, equal_nan=True):
            return np.dtype(narrow).name
    return None


def _bits(dtype: Any) -> str:
    return {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}[dtype.itemsize]


def _max_change(a: Any, b: Any) -> float:
    import numpy as np

    finite = np.isfinite(a) & np.isfinite(b)
    return float(np.max(np.abs(a[finite] - b[finite]), initial=0.0))
