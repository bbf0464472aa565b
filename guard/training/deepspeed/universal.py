"""DeepSpeed Universal Checkpointing folders (``ds_to_universal.py``): ``<tag>/zero/<param>/fp32.pt``.

Each parameter has a folder of its own holding ``{'param': the whole tensor, 'cat_dim': 0}`` for its fp32
master (``fp32.pt``) and its moments (``exp_avg.pt``, ``exp_avg_sq.pt``, ``step.pt``), beside
``zero/optimizer_state.pt`` and the model states.  The masters are whole tensors here: each is one byte
range, checked against ``param_shapes`` (CG118) and present for every parameter (CG114).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding
from guard.readers.torch.pickle import DictDesc, TensorRef
from guard.sources import LocalFile
from guard.tensors import TensorInfo
from guard.training.deepspeed.files import ZeroFile, read_zero_file
from guard.training.deepspeed.partitions import Piece, Placed
from guard.training.deepspeed.records import ModelStates

FOLDER = "zero"  # ds_to_universal's folder of parameter folders
MASTER = "fp32.pt"
MOMENTS = ("exp_avg.pt", "exp_avg_sq.pt")


class UnsafeFile(MalformedCheckpoint):
    """A parameter file whose pickle names a global outside the allow-lists (CG003)."""


def is_universal(directory: str) -> bool:
    return os.path.isdir(os.path.join(directory, FOLDER))


def _param(path: str, shown: str) -> TensorInfo | None:
    """The ``param`` tensor of one ``{'param': tensor, 'cat_dim': 0}`` file; None when it holds no tensor."""
    with LocalFile(path, name=shown) as source:
        zfile = read_zero_file(source)
    if zfile.unsafe:
        raise UnsafeFile(f"pickle references {', '.join(zfile.unsafe)}, which is in neither the tensor allowlist "
                         "nor DeepSpeed's inert classes (it was not imported or called)")
    return param_in(zfile)


def param_in(zfile: ZeroFile) -> TensorInfo | None:
    """The ``param`` tensor of a walked parameter file (the fuzz targets read it so too)."""
    root = zfile.root
    for key, value in (root.items if isinstance(root, DictDesc) else []):
        if key == "param" and isinstance(value, TensorRef):
            return zfile.tensor("param", value)
    return None


def read_universal(directory: str, name: str, model: ModelStates
                   ) -> tuple[list[Placed], list[tuple[str, str, int]], list[Finding]]:
    """(the placed masters, (kind, dtype, elements) of every tensor read, findings)."""
    placed: list[Placed] = []
    homes: list[tuple[str, str, int]] = []
    findings: list[Finding] = []
    for param, shape in _params(model):
        folder = os.path.join(directory, FOLDER, param)
        shown = f"{name.rstrip('/')}/{FOLDER}/{param}/{MASTER}"
        if not os.path.isfile(os.path.join(folder, MASTER)):
            findings.append(make_finding("CG114", shown, f"universal checkpoint file missing: param_shapes names "
                                         f"{param!r}, and {FOLDER}/{param}/{MASTER} is not there"))
            continue
        try:
            master = _param(os.path.join(folder, MASTER), shown)
        except UnsafeFile as exc:
            findings.append(make_finding("CG003", shown, str(exc)))
            continue
        except MalformedCheckpoint as exc:
            findings.append(make_finding("CG001", shown, f"unreadable checkpoint: {exc}"))
            continue
        if master is None or master.data_start is None or master.stride is not None:
            findings.append(make_finding("CG001", shown, "holds no contiguous 'param' tensor"))
            continue
        if master.shape != shape:
            findings.append(make_finding("CG118", shown, f"{param!r} is {list(master.shape)} here, "
                                         f"{list(shape)} in param_shapes"))
            continue
        homes.append(("master", master.dtype, master.numel))
        placed.append(Placed(param, master.dtype, shape, (Piece(master.file, master.data_start, master.numel),),
                             "master"))
        for moment in MOMENTS:
            path = os.path.join(folder, moment)
            moment_shown = f"{name.rstrip('/')}/{FOLDER}/{param}/{moment}"
            try:
                found = _param(path, moment_shown) if os.path.isfile(path) else None  # counted, never read
            except UnsafeFile as exc:
                findings.append(make_finding("CG003", moment_shown, str(exc)))
                found = None
            except MalformedCheckpoint as exc:
                findings.append(make_finding("CG001", moment_shown, f"unreadable checkpoint: {exc}"))
                found = None
            if found is not None:
                homes.append(("optimizer", found.dtype, found.numel))
    findings += _others(directory, name, read={os.path.join(directory, FOLDER, p, f) for p, _ in _params(model)
                                               for f in (MASTER, *MOMENTS)})
    return placed, homes, findings


def _others(directory: str, name: str, *, read: set[str]) -> list[Finding]:
    """Every other file under ``zero/`` (``optimizer_state.pt``, ``step.pt``, anything planted): walked for
    CG003 and CG001 as any pickle is; the folder is the checkpoint's, so nothing in it escapes a scan."""
    findings = []
    root = os.path.join(directory, FOLDER)
    for top, _dirs, files in os.walk(root):  # never follows a symlinked folder
        for base in sorted(files):
            path = os.path.join(top, base)
            if path in read or os.path.islink(path):
                continue
            shown = f"{name.rstrip('/')}/{os.path.relpath(path, directory)}"
            try:
                _param(path, shown)
            except UnsafeFile as exc:
                findings.append(make_finding("CG003", shown, str(exc)))
            except MalformedCheckpoint as exc:
                findings.append(make_finding("CG001", shown, f"unreadable checkpoint: {exc}"))
    return findings


def _params(model: ModelStates) -> Iterator[tuple[str, tuple[int, ...]]]:
    for group in model.param_shapes:
        yield from group
