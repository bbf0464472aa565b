"""What MaxText should hold for a file: the ``convert --to maxtext`` table's leaves, built from the file.

MaxText does not read Hugging Face files; ``parity --against maxtext`` converts the checkpoint first, so
the mapping is the converter's own table (``guard.targets.maxtext``, written from MaxText's
``param_mapping.py`` hooks and checked against them by the tests).  Each leaf is rebuilt here from the
file's tensors, through the row's steps and stacked as the leaf is (experts, scanned layers), one leaf in
memory at a time, and compared with what MaxText's loader holds (``guard.against.tree.compare_held``).
The query-scale rounding is part of MaxText's layout: it is declared by the conversion (CG301), and the
tree must then hold exactly the rounded values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from guard.against.targets import Target
from guard.against.tree import compare_held
from guard.findings import Finding


def compare_maxtext_tree(target: Target, load_label: str, avoid: str | None, items: Path,
                         file_tensors: Mapping[str, Callable[[], Any]], held: Mapping[str, Callable[[], Any]], *,
                         where: str) -> tuple[list[Finding], dict[str, Any]]:
    """``items``: the converted checkpoint (its record names the row, the config and the HF tensors)."""
    from guard.convert.maxtext.back import listed_tensors
    from guard.convert.maxtext.ocdbt import read_custom
    from guard.convert.maxtext.plan import dimensions, plan_leaves
    from guard.targets.maxtext import ARCHITECTURES

    custom = read_custom(items) or {}
    row, config = ARCHITECTURES[custom["row"]], custom["config"]
    listed = listed_tensors(custom.get("hf_tensors"), items)
    leaves, findings = plan_leaves(row, config, listed, scan=bool(custom.get("scan_layers")), path=where)
    unplaced = sorted(set(file_tensors) - {name for leaf in leaves for _, name in leaf.grid})
    expected = {leaf.name: (leaf.grid[0][1], partial(_leaf_from_file, leaf, file_tensors, dimensions(config)["H"]))
                for leaf in leaves}
    compared, figures = compare_held(target, load_label, avoid, expected, unplaced, held, where=where)
    figures.update(row=row.name, scan_layers=bool(custom.get("scan_layers")))
    return findings + compared, figures


def _leaf_from_file(leaf: Any, file_tensors: Mapping[str, Callable[[], Any]], head_dim: int) -> Any:
    """The leaf as the converter lays it out, from the file's tensors in their stored dtype."""
    import numpy as np

    from guard.convert import steps

    array = None
    for at, name in leaf.grid:
        piece = steps.to_target(file_tensors[name](), leaf.param.steps, head_dim)
        if not leaf.axes:
            return piece
        if array is None:
            array = np.empty(leaf.shape, piece.dtype)
        array[leaf.place(at)] = piece
    return array


def convert_first(src: Path, out: Path) -> tuple[Path | None, list[Finding], dict[str, Any]]:
    """``convert SRC --to maxtext`` into ``out`` (scanned: base.yml's ``scan_layers: true``, what MaxText's
    users run); the items directory, or None with the findings that refused it."""
    from guard.convert.maxtext.run import MaxTextRequest, convert_to_maxtext

    findings, figures = convert_to_maxtext(MaxTextRequest(src, out, scan=True))
    items = Path(figures["items"]) if figures.get("written") else None
    return items, findings, {k: figures.get(k) for k in ("architecture", "model_name", "scan_layers",
                                                         "declared_roundings", "maxtext_flags", "maxtext_notes")}
