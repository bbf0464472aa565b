"""Axis permutations near copy speed: numpy on unsigned bit views, walked in cache-sized tiles.

``numpy.ascontiguousarray(a.T)`` walks the source a column at a time: for a 2-byte
dtype every element is a new cache line, and rows whose stride is a power of two
(2048 columns of bf16 is 4 KiB) all land in one cache set, so it runs at a tenth
of a plain copy.  Here a tile of source rows x columns is first copied row by row
into a small staging buffer whose rows are padded off the power of two, and the
transposing copy reads from that buffer while it sits in L1/L2 (about 10x faster
here; bench/convert.py).  Integer views (uint16 for bf16 and fp16) keep numpy on
its plain copy loops and carry every bit, NaN payloads included.

The output is produced in bands of whole leading rows, so a caller can stream it
without ever holding the permuted tensor next to the source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from math import prod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

Perm = tuple[int, ...]
# 512 x 256 (a 288 KiB bf16 staging tile, in L2): each output row is written 1 KiB at a time.  128 x 512 wrote
# 256 bytes at a time: 0.9-1.4 GB/s against 1.7-3.0 GB/s for bf16 matrices of 2048 x 2048, 2048 x 5504 and
# 32000 x 2048 on this 2-CPU VM; fp32 1.2-1.8 against 1.6-2.4 GB/s, fp8 and fp64 no slower (issue 47)
TILE_ROWS = 512  # source rows per tile: output columns
TILE_COLS = 256  # source columns per tile: output rows
PAD = 32  # elements added to each staging row so that its rows do not share a cache set
BAND_BYTES = 4 * 2**20  # a few bands in flight stay in the last-level cache for the writer's copy
SPLIT_BYTES = 2**20  # bands from this size are filled by two threads ...
SPLIT_CPUS = 3  # ... where the writer thread has a core of its own besides (bench/convert.py: on 2 CPUs the
#                 helper takes the writer's core, and a 1.48 GB conversion took 2.52 s with it, 2.28 s without)
MIN_BAND_ROWS = 256  # narrower bands make narrow tiles, which copy at half the speed (a vocab-wide kernel)


def usable_cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def bit_view(a: np.ndarray) -> np.ndarray:
    """The same bytes as unsigned integers of the same width (void for wider items)."""
    import numpy as np

    width = a.dtype.itemsize
    return a.view(np.dtype(f"u{width}") if width in (1, 2, 4, 8) else np.dtype(f"V{width}"))


def reduce_perm(shape: tuple[int, ...], perm: Perm) -> tuple[tuple[int, ...], Perm]:
    """Drop length-1 axes and merge source axes that stay adjacent: (O, I, kH, kW) by (2, 3, 1, 0)
    is (O, I, kH*kW) by (2, 1, 0)."""
    keep = [ax for ax in range(len(shape)) if shape[ax] != 1]
    rank = {ax: i for i, ax in enumerate(keep)}
    order = [rank[ax] for ax in perm if shape[ax] != 1]
    sizes = [shape[ax] for ax in keep]
    groups: list[list[int]] = []
    for ax in order:
        if groups and groups[-1][-1] + 1 == ax:
            groups[-1].append(ax)
        else:
            groups.append([ax])
    by_source = sorted(range(len(groups)), key=lambda g: groups[g][0])
    merged = tuple(prod(sizes[ax] for ax in groups[g]) for g in by_source)
    position = {g: i for i, g in enumerate(by_source)}
    return merged, tuple(position[g] for g in range(len(groups)))


def permuted_shape(shape: tuple[int, ...], perm: Perm | None) -> tuple[int, ...]:
    return shape if perm is None else tuple(shape[ax] for ax in perm)


def permuted_bands(a: np.ndarray, perm: Perm | None,
                   buffer: Callable[[int], np.ndarray]) -> Iterator[np.ndarray]:
    """``a.transpose(perm)`` in C order, as consecutive 1-D bit-view bands.

    ``buffer(n)`` returns a writable 1-D array of ``n`` elements of ``bit_view(a).dtype``
    for the next band; each yielded band is that buffer, filled.
    """
    import numpy as np

    src = bit_view(np.ascontiguousarray(a))
    if src.size == 0:
        return
    shape, order = reduce_perm(src.shape, tuple(range(src.ndim)) if perm is None else perm)
    src = src.reshape(shape)
    if order == tuple(range(len(order))):  # nothing moves: bands of the flat source
        flat = src.reshape(-1)
        step = max(1, BAND_BYTES // src.itemsize)
        for start in range(0, flat.size, step):
            out = buffer(min(step, flat.size - start))
            out[...] = flat[start:start + out.size]
            yield out
        return
    if order in ((1, 0), (0, 2, 1)):
        yield from _matrix_bands(src.reshape((-1, *shape[-2:])), buffer)
        return
    yield from _generic_bands(src, order, buffer)


def _matrix_bands(src: np.ndarray, buffer: Callable[[int], np.ndarray]) -> Iterator[np.ndarray]:
    """Each of ``src``'s (R, C) matrices transposed; bands of whole output rows (source columns).

    A band's second half is filled on a helper thread while this one fills the first: numpy drops the
    GIL for each tile copy, so two cores share the transposing when the machine has them to spare
    (SPLIT_CPUS: the writer thread keeps a core).
    """
    from concurrent.futures import ThreadPoolExecutor

    split_bytes = SPLIT_BYTES if usable_cpus() >= SPLIT_CPUS else 2**63
    _batch, rows, cols = src.shape
    per_band = max(MIN_BAND_ROWS, BAND_BYTES // (rows * src.itemsize))
    stages = [_stage(src.dtype), _stage(src.dtype)]
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-guard-transpose") as helper:
        for matrix in src:
            for c0 in range(0, cols, per_band):
                c1 = min(cols, c0 + per_band)
                out = buffer((c1 - c0) * rows).reshape(c1 - c0, rows)
                half = (c1 - c0) // 2 if (c1 - c0) * rows * src.itemsize >= split_bytes else 0
                other = helper.submit(_fill, matrix, out, c0, c0 + half, c1, stages[1]) if half else None
                _fill(matrix, out, c0, c0, c0 + half if half else c1, stages[0])
                if other is not None:
                    other.result()
                yield out.reshape(-1)


def _stage(dtype: np.dtype) -> np.ndarray:
    import numpy as np

    return np.empty((TILE_ROWS, TILE_COLS + PAD), dtype)


def _fill(matrix: np.ndarray, out: np.ndarray, c0: int, lo: int, hi: int, stage: np.ndarray) -> None:
    """Output rows ``lo:hi`` (source columns) of the band that starts at source column ``c0``."""
    rows = matrix.shape[0]
    for j in range(lo, hi, TILE_COLS):
        width = min(TILE_COLS, hi - j)
        for i in range(0, rows, TILE_ROWS):
            height = min(TILE_ROWS, rows - i)
            tile = stage[:height, :width]
            tile[...] = matrix[i:i + height, j:j + width]  # rows copied whole into a padded tile ...
            out[j - c0:j - c0 + width, i:i + height] = tile.T  # ... transposed out of L1/L2


def _generic_bands(src: np.ndarray, order: Perm, buffer: Callable[[int], np.ndarray]) -> Iterator[np.ndarray]:
    """Any other permutation (3-D conv kernels and the like): numpy's own strided copy, a row at a time."""
    import numpy as np

    view = src.transpose(order)
    lead = 0  # leading output axes walked in Python, so that a band stays near BAND_BYTES
    while lead < view.ndim and prod(view.shape[lead:]) * src.itemsize > BAND_BYTES:
        lead += 1
    for index in np.ndindex(*view.shape[:lead]):
        block = view[index]
        out = buffer(block.size)
        out.reshape(block.shape)[...] = block
        yield out
