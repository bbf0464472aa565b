"""CG301: the written output, read back independently of the code that wrote it.

"Verified" means, for every planned tensor:

1. The files parse with the scanner's own readers (safetensors, msgpack) or the Orbax
   reader convert reads sources with, and list each tensor exactly once with its
   planned dtype and shape; nothing unplanned.
2. Its bytes sit exactly where the writer put them: the parsed byte range equals the
   recorded one, so no framing error can shift a tensor into its neighbour.
3. ``SAMPLES`` elements (the first, the last and a fixed pseudo-random set) read back
   from the output file equal, bit for bit, the source elements at the permuted
   index, read from the source file, cast where a cast was asked.  This checks the
   mapping, the transposition and the placement against the source itself, with no
   trust in the buffers in between.  A dequantized tensor's source elements are recomputed
   from the quantized source: only the sampled ones, from their bytes in the source file,
   where its dequantizer has ``elements`` (fine-grained FP8, bitsandbytes 4-bit: the same
   float32 arithmetic, so bit-identical to the module it made), else by dequantizing its
   module once more; never taken from the arrays the writer was handed.
4. With ``--verify full`` also: every byte is read back and its CRC32 equals the CRC32
   of the bytes handed to ``write()``.  It costs a second pass over the output; the
   default leaves it out because a page-cache read-back only proves what the
   kernel returns, and 1-3 already catch what a converter gets wrong.
"""

from __future__ import annotations

import os
import random
import zlib
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING

from guard.catalogue import make_finding
from guard.findings import Finding
from guard.readers import scan_file
from guard.sources import LocalFile
from guard.tensors import TensorInfo
from guard.write.bitviews import numpy_dtype, storage_dtype
from guard.write.cast import CastCheck
from guard.write.produce import ranged
from guard.write.transpose import bit_view
from guard.write.writer import OutputTensor, Written

if TYPE_CHECKING:
    import numpy as np

SAMPLES = 32
CRC_BLOCK = 16 * 2**20


def verify_output(directory: Path, outputs: list[OutputTensor], written: Written, *, layout: str,
                  full: bool = False) -> tuple[list[Finding], int]:
    parsed, findings = _parse(directory, layout, written)
    for tensor in outputs:
        info = parsed.pop(".".join(tensor.name.split("/")) if layout == "orbax" else tensor.name, None)
        if info is None or info.dtype != tensor.dtype or info.shape != tensor.shape:
            got = "missing" if info is None else f"{info.dtype} {list(info.shape)}"
            findings.append(_cg301(str(directory), f"{tensor.name}: wrote {tensor.dtype} {list(tensor.shape)}, "
                                                   f"read {got}", tensor.name))
            continue
        places = [(directory / file, start, length) for file, start, length in written.places[tensor.name]]
        if info.data_start is not None and tensor.nbytes:
            assert info.data_end is not None
            if places != [(Path(info.file), info.data_start, info.data_end - info.data_start)]:
                findings.append(_cg301(info.file, f"{tensor.name}: its bytes are not where they were written",
                                       tensor.name))
                continue
        problem = _sampled_mismatch(tensor, places) or (full and _crc_mismatch(tensor, places, written))
        if problem:
            findings.append(_cg301(str(places[0][0]), f"{tensor.name}: {problem}", tensor.name))
    findings.extend(_cg301(i.file, f"{n}: written but never planned", n) for n, i in parsed.items())
    return findings, len(outputs)


def _cg301(path: str, message: str, tensor: str | None = None) -> Finding:
    return make_finding("CG301", Path(path).name, message, tensor=tensor)


def _parse(directory: Path, layout: str, written: Written) -> tuple[dict[str, TensorInfo], list[Finding]]:
    findings: list[Finding] = []
    seen: dict[str, TensorInfo] = {}
    if layout == "orbax":  # the scanner's Orbax reader, and the chunk files it does not open
        from guard.inventory.orbax_dirs import scan_local_orbax

        scan = scan_local_orbax(directory, name=directory.name)
        findings.extend(_cg301(f.path, f"written checkpoint does not read back: {f.message}") for f in scan.findings)
        infos = [_orbax_info(directory, t) for t in scan.tensors]
    else:
        infos = []
        files = {place[0] for places in written.places.values() for place in places}
        for path in sorted(directory / name for name in files):
            with LocalFile(path) as source:
                scan = scan_file(source)
            findings.extend(_cg301(path.name, f"written file does not read back: {f.message}")
                            for f in scan.findings)
            infos.extend(scan.tensors)
    for info in infos:
        if info.name in seen:
            findings.append(_cg301(info.file, f"{info.name}: written twice", info.name))
        seen[info.name] = info
    return seen, findings


def _orbax_info(directory: Path, info: TensorInfo) -> TensorInfo:
    """Its bytes: the leaf's one chunk file, which the reader does not open (its size is checked here)."""
    from guard.write.orbax_layout import chunk_name

    chunk = directory / info.name / chunk_name(len(info.shape))
    size = chunk.stat().st_size if chunk.is_file() and not chunk.is_symlink() else 0
    return info._replace(file=str(chunk), data_start=0, data_end=size)


def _sampled_mismatch(tensor: OutputTensor, places: list[tuple[Path, int, int]]) -> str:
    import numpy as np

    count = prod(tensor.shape)
    if not count:
        return ""
    pick = random.Random(zlib.crc32(tensor.name.encode()))
    flat = sorted({0, count - 1, *(pick.randrange(count) for _ in range(SAMPLES - 2))})
    out_index = np.unravel_index(flat, tensor.shape) if tensor.shape else ()
    source = tensor.mapped.source
    src_index = list(out_index)
    if tensor.mapped.perm is not None:
        for axis, ax in enumerate(tensor.mapped.perm):
            src_index[ax] = out_index[axis]
    src_flat = np.ravel_multi_index(tuple(src_index), source.info.shape) if source.info.shape else [0]
    cast = tensor.dtype != source.info.dtype
    # compared as bits; values (ml_dtypes' floats) only where the source elements must be cast first
    source_dtype = numpy_dtype(source.info.dtype) if cast else storage_dtype(source.info.dtype)
    try:
        want = _source_elements(source, [int(i) for i in src_flat], source_dtype)
        got = _read_elements(places, flat, storage_dtype(tensor.dtype))
    except _ShortRead as exc:
        return str(exc)
    if cast:
        want = CastCheck(tensor.dtype).cast(want)
    differs = np.flatnonzero(bit_view(got) != bit_view(want))
    if not len(differs):
        return ""
    at = differs[0]
    where = [int(i[at]) for i in out_index] if tensor.shape else []
    return (f"element {where} reads {bit_view(got)[at]:#x} but the source {source.name} holds "
            f"{bit_view(want)[at]:#x} there")


def _source_elements(source, flat: list[int], dtype: np.dtype) -> np.ndarray:
    import numpy as np

    info = source.info
    if hasattr(source.loader, "elements"):  # a dequantized module: its sampled elements recomputed from the source
        return np.asarray(source.loader.elements(info, flat)).view(dtype)
    if not ranged(source):
        return np.array(bit_view(source.load()).reshape(-1)[flat]).view(dtype)
    assert info.data_start is not None
    return _read_elements([(Path(info.file), info.data_start, info.data_end - info.data_start)], flat, dtype)


class _ShortRead(Exception):
    """A file ends before a sampled element: it was truncated after it was written, or read."""


def _read_elements(places: list[tuple[Path, int, int]], flat: list[int], dtype: np.dtype) -> np.ndarray:
    """Elements by flat index from a body laid out in ``places`` (several segments for chunked leaves).

    A short read raises _ShortRead: padding it would let a truncated file of zeros pass."""
    import numpy as np

    out = bytearray()
    size = dtype.itemsize
    fds: dict[Path, int] = {}
    try:
        for index in flat:
            offset = index * size
            for path, start, length in places:
                if offset < length:
                    fd = fds.get(path) or fds.setdefault(path, os.open(path, os.O_RDONLY))
                    element = os.pread(fd, size, start + offset)
                    if len(element) < size:
                        raise _ShortRead(f"{path.name} ends before element {index} at byte {start + offset:,}")
                    out += element
                    break
                offset -= length
    finally:
        for fd in fds.values():
            os.close(fd)
    return np.frombuffer(bytes(out), dtype)


read_elements = _read_elements  # for the dequantizers' sampled recomputation (guard.convert.read.dequant.source)


def _crc_mismatch(tensor: OutputTensor, places: list[tuple[Path, int, int]], written: Written) -> str:
    crc = 0
    for path, start, length in places:
        with open(path, "rb") as fh:
            fh.seek(start)
            while length:
                block = fh.read(min(length, CRC_BLOCK))
                if not block:
                    break
                crc = zlib.crc32(block, crc)
                length -= len(block)
    return "" if crc == written.crcs.get(tensor.name) else "bytes changed on disk (CRC32 differs)"
