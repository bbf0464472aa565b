"""A ZeRO checkpoint as a conversion source: the consolidated state dict ``zero_to_fp32`` would build.

Each tensor is read from its byte ranges in the ranks' master partitions when the writer asks for it,
one tensor at a time: peak memory is about one tensor (and the writer's band), whatever the model's size,
and the optimizer moments are never read.  Floating buffers are upcast to fp32 exactly, as
``zero_to_fp32`` does.  A checkpoint with a problem (CG001, CG003, CG114, CG118, CG119) gives its
findings and no tensor, so nothing is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from guard.catalogue import make_finding
from guard.convert.read.source import SourceModel
from guard.errors import MalformedCheckpoint
from guard.tensors import TensorInfo
from guard.training.deepspeed.dirs import LATEST, build_state, claim, latest_problem, read_ranks
from guard.training.deepspeed.files import parse_name
from guard.training.deepspeed.partitions import Placed
from guard.training.state import model_key
from guard.write.plan import SourceTensor

if TYPE_CHECKING:
    import numpy as np

FORMAT = "deepspeed-zero"
LATEST_UNIVERSAL = "latest_universal"


def zero_tag_dir(src: Path) -> tuple[Path, Path] | None:
    """(the tag folder, the folder whose config.json describes the model), or None: not a ZeRO checkpoint.

    ``src`` is the tag folder itself (``global_stepN/``), or the folder with ``latest`` in it (DeepSpeed's
    save folder, the Trainer's ``checkpoint-N/``), whose ``latest`` says which tag to read.
    """
    if not src.is_dir():
        return None
    names = frozenset(p.name for p in src.iterdir() if p.is_file())
    if any(parse_name(n) is not None for n in names):
        return src, src if "config.json" in names else src.parent
    if LATEST in names:
        if latest_problem(str(src), names) is not None:
            return src / LATEST, src  # named, so that the source says CG119
    for pointer in (LATEST, LATEST_UNIVERSAL):  # `latest_universal`: ds_to_universal's pointer to its output
        if pointer in names:
            with open(src / pointer, "rb") as fh:  # a few bytes: the pointer holds one folder's name
                tag = fh.read(4096).decode("utf-8", "replace").strip()
            if _is_tag(tag) and (src / tag).is_dir() and any(parse_name(p.name) for p in (src / tag).iterdir()):
                return src / tag, src
    return None


def _is_tag(tag: str) -> bool:
    """A folder's name beside the pointer, never a path out of it (the pointer is a file anyone can write)."""
    return bool(tag) and tag not in (".", "..") and "/" not in tag and "\\" not in tag and "\0" not in tag


def open_zero(tag_dir: Path) -> SourceModel:
    model = SourceModel("torch", FORMAT, [], None)
    if tag_dir.name == LATEST:  # zero_tag_dir's way of saying `latest` names nothing
        problem = latest_problem(str(tag_dir.parent), frozenset(os.listdir(tag_dir.parent)))
        model.findings.append(make_finding("CG119", str(tag_dir), f"{problem}; nothing to consolidate"))
        return model
    names = frozenset(p.name for p in tag_dir.iterdir() if p.is_file())
    found = claim(str(tag_dir), names)
    assert found is not None
    name = str(tag_dir)
    tensor_parallel = [n for n in found.claimed if getattr(parse_name(n), "mp", 0)]
    if tensor_parallel:
        model.findings.append(make_finding(
            "CG304", f"{name}/{tensor_parallel[0]}", "tensor-parallel ZeRO ranks (mp_rank > 0): their slices "
            "cannot be joined without the model's parallel layout; convert refuses rather than guess"))
        return model
    ranks = read_ranks(found, name=name)
    state, findings, placed = build_state(found, name=name, models=ranks.models, optims=ranks.optims)
    model.findings += ranks.findings + findings
    if model.findings:
        return model
    if not placed:
        model.findings.append(make_finding("CG001", name,
                                           "the ZeRO checkpoint places no tensor: nothing to consolidate"))
        return model
    read = {Path(piece.file) for p in placed for piece in p.pieces}  # the files whose bytes are read: bytes_in
    model.files = sorted(read | {tag_dir / n for n in found.claimed if not n.endswith("/")})
    keyed = {model_key((p.name,)): p for p in placed}  # the model's own keys: `module.`, `_orig_mod.` stripped
    loader = PieceLoader(keyed)
    for key, p in keyed.items():
        info = TensorInfo(key, "F32" if p.upcast else p.dtype, p.shape, p.pieces[0].file if p.pieces else name)
        model.tensors.append(SourceTensor(info, loader))
    return model


class PieceLoader:
    """Reads a placed tensor's pieces into one fresh array; never holds more than the tensor it returns."""

    def __init__(self, placed: dict[str, Placed]) -> None:
        self.placed = placed

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        from guard.write.bitviews import numpy_dtype
        from guard.write.produce import read_into

        placed = self.placed[info.name]
        stored = numpy_dtype(placed.dtype)
        total = sum(p.numel for p in placed.pieces) * stored.itemsize
        buf = np.empty(total, np.uint8)
        view, at = buf.data, 0  # memoryview(buf), typed (numpy types __buffer__ from 3.12)
        for piece in placed.pieces:
            size = piece.numel * stored.itemsize
            if piece.start is None:
                raise MalformedCheckpoint(f"{piece.file}: {info.name} was not placed in its file")
            with open(piece.file, "rb", buffering=0) as fh:
                fh.seek(piece.start)
                if read_into(fh, view[at:at + size]) < size:
                    raise MalformedCheckpoint(f"{piece.file}: {info.name} runs past the end of the file")
            at += size
        array = buf.view(stored).reshape(placed.shape)
        return array.astype(np.float32) if placed.upcast else array  # bf16/fp16 -> fp32 is exact


find_checkpoint = zero_tag_dir  # guard.convert.read.source_training's protocol
open_checkpoint = open_zero
