"""CG107 from values (``--values``): copies of one model that agree on dtypes and shapes, compared by value.

A Flax copy left behind when the PyTorch weights were retrained and re-saved keeps every
dtype and shape, so the header checks (``guard.rules.copies``) pass it.  Here each pair of
tensors is hashed (BLAKE2b over its bytes in PyTorch's axis order: a Flax kernel is
permuted back in bands by the writing layer's own code), one tensor at a time, and a copy
whose hashes differ from its reference's is CG107.  Names are paired by convert's own
mapping (``guard.convert.map``), the one that would regenerate the copy; a copy the
header checks already flagged is left to that finding.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from guard.catalogue import make_finding
from guard.config import Policy
from guard.errors import GuardError
from guard.findings import Finding, shown
from guard.inventory import ModelInventory, WeightSet
from guard.records import Record
from guard.rules.copies import PYTORCH_NAMES, check_copies_agree, copy_pairs, regenerate_fix
from guard.tensors import TensorInfo
from guard.write.plan import Perm, SourceTensor

if TYPE_CHECKING:
    import numpy as np

CHUNK_BYTES = 1024 * 1024
LIBRARIES = {"flax": "Flax", "torch": "PyTorch"}


class Side(Record):
    info: TensorInfo
    perm: Perm | None  # the axes of the stored array in PyTorch's order (None: already so)


class Pair(Record):
    reference: Side
    copy: Side


def copy_value_findings(inv: ModelInventory, policy: Policy) -> list[Finding]:
    flagged = {f.set for f in check_copies_agree(inv, policy)}  # dtypes or names disagree: one finding is enough
    findings = []
    for reference, ws in copy_pairs(inv):
        if ws.name in flagged:
            continue
        pairs = pair_tensors(inv, reference, ws)
        if pairs:
            finding = _compare(inv, reference, ws, pairs)
            if finding is not None:
                findings.append(finding)
    return findings


def _framework(ws: WeightSet) -> str | None:
    return "torch" if ws.format in PYTORCH_NAMES else "flax" if ws.format == "flax" else None


def pair_tensors(inv: ModelInventory, reference: WeightSet, ws: WeightSet) -> list[Pair]:
    """The tensors of ``reference`` and ``ws`` that hold the same weights; [] where the names cannot be paired."""
    ref_fw, copy_fw = _framework(reference), _framework(ws)
    if ref_fw is None or copy_fw is None:
        return []
    ref, copy = _located(reference), _located(ws)
    if ref_fw == copy_fw:
        return [Pair(Side(ref[n], None), Side(copy[n], None)) for n in sorted(ref.keys() & copy.keys())]
    torch_side, flax_side = (ref, copy) if ref_fw == "torch" else (copy, ref)
    pairs = []
    for torch_info, flax_info, perm in _mapped(inv, torch_side, flax_side):
        a, b = Side(torch_info, None), Side(flax_info, perm)
        pairs.append(Pair(a, b) if ref_fw == "torch" else Pair(b, a))
    return pairs


def _mapped(inv: ModelInventory, torch_side: dict[str, TensorInfo],
            flax_side: dict[str, TensorInfo]) -> Iterator[tuple[TensorInfo, TensorInfo, Perm | None]]:
    """Each PyTorch tensor with the Flax leaf convert would write it to, and the permutation back."""
    from guard.convert.map.mapped import Refusal
    from guard.convert.map.naming import map_tensors
    from guard.convert.map.rules import inverse
    from guard.convert.read.source import SourceModel

    source = SourceModel("torch", "safetensors", [], None, [SourceTensor(t, _NOT_LOADED) for t in torch_side.values()])
    config = inv.config if isinstance(inv.config, dict) else None
    try:
        mapping = map_tensors(source, config, to="flax", where=inv.config_path or inv.path)
    except Refusal:  # no model_type convert knows: the names cannot be paired
        return
    for m in mapping.tensors:
        leaf = flax_side.get("/".join(m.target))
        if leaf is not None:
            yield m.source.info, leaf, None if m.perm is None else inverse(m.perm)


class _NotLoaded:
    """Pairing reads names only; a tensor is read by byte range when it is hashed."""

    def load(self, info: TensorInfo) -> np.ndarray:
        raise AssertionError(f"{info.name}: the copy check reads tensors by byte range only")


_NOT_LOADED = _NotLoaded()


def _located(ws: WeightSet) -> dict[str, TensorInfo]:
    """The set's tensors by name; a torch zip scanned headers-only is re-read to place its storages."""
    from guard.readers import READ_FAILURES
    from guard.readers.torch.zip import read_torch_zip
    from guard.sources import LocalFile

    out: dict[str, TensorInfo] = {}
    for scan in ws.files:
        tensors = scan.tensors
        if scan.format == "torch-zip" and any(t.data_start is None for t in tensors):
            try:
                with LocalFile(scan.path, name=scan.path) as source:
                    tensors = read_torch_zip(source, locate_data=True).tensors
            except (OSError,) + READ_FAILURES:
                pass  # its tensors stay unplaced, and are counted as not compared
        out.update((t.name, t) for t in tensors)
    return out


def _compare(inv: ModelInventory, reference: WeightSet, ws: WeightSet, pairs: list[Pair]) -> Finding | None:
    from guard.write.produce import BandPool, SourceBuffer

    pool, buffer, chunk = BandPool(), SourceBuffer(), mmap.mmap(-1, CHUNK_BYTES)
    compared, skipped, differ = 0, 0, []
    for pair in pairs:
        ref, copy = pair.reference.info, pair.copy.info
        if ref.dtype != copy.dtype or not _readable(ref) or not _readable(copy):
            skipped += 1
            continue
        try:
            same = _shape(pair.reference) == _shape(pair.copy) and (
                _digest(pair.reference, pool, buffer, chunk) == _digest(pair.copy, pool, buffer, chunk))
        except (OSError, GuardError):  # a file that shrank or vanished since its header was read
            skipped += 1
            continue
        compared += 1
        if not same:
            differ.append(copy.name)
    chunk.close()
    if not differ:
        return None
    library = LIBRARIES[_framework(ws) or "torch"]
    unchecked = f"; {skipped} not compared (other dtypes, or bytes not placed by the headers)" if skipped else ""
    message = (f"{ws.name} holds other values than {reference.name}: {len(differ)} of {compared} tensor(s) "
               f"differ with the same dtypes and shapes (e.g. {shown(differ[0])}){unchecked}. A stale copy, left "
               f"behind when {reference.name} was re-saved: {library} users get other weights")
    return make_finding("CG107", ws.files[0].path, message, tensor=differ[0])._replace(
        set=ws.name, fix=regenerate_fix(inv, reference, ws))


def _shape(side: Side) -> tuple[int, ...]:
    shape = side.info.shape
    return shape if side.perm is None else tuple(shape[i] for i in side.perm)


def _readable(info: TensorInfo) -> bool:
    """One C-ordered byte range of a local file, as long as its dtype and shape say."""
    if info.data_start is None or info.data_end is None or info.stride is not None or info.nbytes is None:
        return False
    try:
        return info.data_end - info.data_start == info.nbytes and os.path.getsize(info.file) >= info.data_end
    except OSError:  # not a local file (a Hub scan), or gone
        return False


def _digest(side: Side, pool: Any, buffer: Any, chunk: mmap.mmap) -> bytes:
    """BLAKE2b of the tensor's bytes in PyTorch's axis order: one tensor and a few bands in memory."""
    import numpy as np

    from guard.write.produce import body_pieces

    digest = hashlib.blake2b(digest_size=16)
    tensor = SourceTensor(side.info, _NOT_LOADED)
    for piece in body_pieces(tensor, side.perm, side.info.dtype, pool=pool, source=buffer, check=None):
        if piece[0] == "range":
            _hash_range(digest, piece[1], piece[2], piece[3], chunk)
        else:
            flat = np.ascontiguousarray(piece[1]).reshape(-1).view(np.uint8)
            digest.update(flat.data)  # the array's buffer, as memoryview(flat) (numpy types __buffer__ from 3.12)
            if piece[2] is not None:
                piece[2]()  # the band goes back to the pool
    return digest.digest()


def _hash_range(digest: Any, path: str, start: int, length: int, chunk: mmap.mmap) -> None:
    whole = memoryview(chunk)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        pos, end = start, start + length
        while pos < end:
            got = os.preadv(fd, [whole[:min(len(chunk), end - pos)]], pos)
            if got <= 0:
                raise OSError(f"{path}: the file ended at byte {pos:,} (changed while it was read?)")
            digest.update(whole[:got])
            pos += got
    finally:
        whole.release()
        os.close(fd)
