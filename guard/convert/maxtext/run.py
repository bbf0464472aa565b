"""``convert SRC --to maxtext`` and ``convert OUT --to torch`` for a MaxText checkpoint: findings plus figures.

Streamed one MaxText leaf at a time: an unscanned leaf is one HF tensor (or one layer's
experts), a scanned leaf one parameter stacked across the layers, as MaxText's own
converter builds it.  The output is written into a hidden sibling directory and renamed
into place only when complete; a refusal writes nothing.
"""

from __future__ import annotations

import time
from math import prod
from pathlib import Path
from typing import Any

from guard.catalogue import make_finding
from guard.convert import steps
from guard.convert.maxtext.flags import flag_notes, maxtext_flags, model_name
from guard.convert.maxtext.ocdbt import ItemsWriter, items_dir
from guard.convert.maxtext.plan import Leaf, choose_row, dimensions, plan_leaves
from guard.convert.maxtext.refusals import UNCONVERTED
from guard.errors import GuardError, MalformedCheckpoint, UsageError
from guard.findings import Finding, Severity
from guard.records import Record
from guard.targets import TARGETS
from guard.targets.maxtext import ARCHITECTURES, Architecture
from guard.write.cast import CastCheck, CastPolicy

FORMAT_VERSION = 1
TARGET = TARGETS["maxtext"]  # its row: the library's version is its environment's


class MaxTextRequest(Record):
    src: Path
    out: Path
    scan: bool = False
    cast: CastPolicy = CastPolicy(None)
    allow_lossy: bool = False


def _blocking(findings: list[Finding]) -> bool:
    return any(f.severity is Severity.error for f in findings)


def convert_to_maxtext(req: MaxTextRequest) -> tuple[list[Finding], dict[str, Any]]:
    from guard.convert.carry import read_config
    from guard.convert.read.source import open_source
    from guard.convert.run import check_paths

    started, started_ns = time.monotonic(), time.time_ns()
    check_paths(req.src, req.out)
    config, findings = read_config(req.src)
    figures: dict[str, Any] = {"source": str(req.src), "output": str(req.out), "to": "maxtext", "target": TARGET.name,
                               "library": f"MaxText {TARGET.version} (AI-Hypercomputer/maxtext)",
                               "scan_layers": req.scan, "written": False}
    if findings:
        return findings, figures
    if config is None:
        raise UsageError(f"{req.src}: no config.json; MaxText's tree (layers, heads, head_dim) is read from it")
    source = open_source(req.src, to="flax")  # the PyTorch-side weights (safetensors first)
    figures.update({"from": source.format, "tensors_in": len(source.tensors), "shards_in": len(source.files)})
    if source.framework != "torch":
        raise UsageError(f"{req.src}: only {source.format} weights here; convert them --to torch first")
    findings += source.findings
    row = choose_row(config)
    if row is None and not _blocking(findings):
        known = sorted({t for r in ARCHITECTURES.values() for t in r.model_types})
        why = UNCONVERTED.get(str(config.get("model_type")))
        findings.append(make_finding("CG304", str(req.src / "config.json"),
                                     f"model_type {config.get('model_type')!r}: {why}" if why else
                                     f"model_type {config.get('model_type')!r} has no row in the MaxText target "
                                     f"(rows for: {', '.join(known)})"))
    if _blocking(findings) or row is None:
        return findings, figures
    by_name = {t.name: t for t in source.tensors}
    leaves, plan_findings = plan_leaves(row, config, {n: t.info for n, t in by_name.items()}, scan=req.scan,
                                        path=str(req.src))
    findings += plan_findings
    figures.update({"architecture": row.name, "model_name": row.model_name, "cite": row.cite})
    if _blocking(findings):
        return findings, figures
    return _write(req, config, row, leaves, by_name, findings, figures, started, started_ns)


def _write(req: MaxTextRequest, config: dict[str, Any], row: Architecture, leaves: list[Leaf],
           by_name: dict[str, Any], findings: list[Finding], figures: dict[str, Any], started: float,
           started_ns: int) -> tuple[list[Finding], dict[str, Any]]:
    from guard.write.bitviews import numpy_dtype
    from guard.write.publish import discard, make_temp_dir, publish

    head_dim = dimensions(config)["H"]
    temp = make_temp_dir(req.out)
    rounded: dict[str, list[int]] = {}  # the row's parameter -> [changed elements, elements]
    hf_tensors: dict[str, list[Any]] = {}
    cast_findings: list[Finding] = []
    try:
        writer = ItemsWriter(items_dir(temp))
        for leaf in leaves:
            code = req.cast.dtype_for(leaf.dtype, leaf.grid[0][1], leaf.name)
            check = CastCheck(code)
            array = None
            for at, name in leaf.grid:
                original = check.cast(by_name[name].load())
                piece = steps.to_target(original, leaf.param.steps, head_dim)
                count = steps.rounded_elements(original, piece, leaf.param.steps, head_dim)
                if steps.ROUNDING.intersection(leaf.param.steps):
                    tally = rounded.setdefault(leaf.param.maxtext, [0, 0])
                    tally[0] += count
                    tally[1] += original.size
                hf_tensors[name] = [code, list(original.shape)]
                if not leaf.axes:
                    array = piece
                    break
                if array is None:
                    import numpy as np

                    array = np.empty(leaf.shape, numpy_dtype(code))
                array[leaf.place(at)] = piece
            found = check.finding(name=leaf.name, path=str(req.src))
            if found is not None:
                cast_findings.append(found._replace(severity=Severity.warning) if req.allow_lossy else found)
            assert array is not None  # every leaf's pieces were placed above
            writer.write(leaf.key, array)
        findings += cast_findings
        findings += _rounding_findings(rounded, row, head_dim, req.src)
        if _blocking(findings):
            discard(temp)
            return findings, figures
        custom = {"format": FORMAT_VERSION, "target": TARGET.name, "row": row.name, "scan_layers": req.scan,
                  "config": config, "hf_tensors": hf_tensors,
                  "declared_roundings": {k: v[0] for k, v in rounded.items()}}
        writer.finish(custom, started_ns)
        publish(temp, req.out)
    except MalformedCheckpoint as exc:
        discard(temp)
        raise GuardError(f"{req.src}: {str(exc).splitlines()[0][:300]}; nothing written") from None
    except BaseException:
        discard(temp)
        raise
    figures.update({
        "written": True, "items": str(items_dir(req.out)), "leaves": len(leaves), "model_name": model_name(row, config),
        "parameters": sum(prod(leaf.shape) for leaf in leaves),
        "declared_roundings": {k: {"changed": v[0], "elements": v[1]} for k, v in rounded.items()},
        "maxtext_flags": maxtext_flags(row, config, items=items_dir(req.out).resolve(), scan=req.scan),
        "maxtext_notes": flag_notes(row, config), "seconds": round(time.monotonic() - started, 3)})
    return findings, figures




def _rounding_findings(rounded: dict[str, list[int]], row: Architecture, head_dim: int,
                       src: Path) -> list[Finding]:
    says = {p.maxtext: [steps.ROUNDING_SAYS[n] for n in p.steps if n in steps.ROUNDING] for p in row.params}
    out = []
    for param, (changed, total) in rounded.items():
        if changed:
            what = "; ".join(says.get(param) or ["rounds it"]).replace("head_dim)", f"{head_dim})", 1)
            out.append(make_finding(
                "CG301", str(src),
                f"declared rounding: MaxText's {row.model_name} layout of {param} {what}; {changed} of {total} "
                "elements will not convert back bit-exactly; every tensor without such a step is a transpose or "
                "reshape, bit-exact", tensor=param)._replace(severity=Severity.warning))
    return out
