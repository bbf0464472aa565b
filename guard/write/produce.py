"""Each output tensor's bytes as a stream of pieces: read once, permuted in tiles, cast in bands.

A piece is ``("range", path, start, length)`` (bytes the writer copies straight from
a source file, in the kernel where it can) or ``("bytes", buffer, release)``.  A
tensor that neither moves nor changes dtype is a single range; every other tensor is
read by byte range into one reused buffer (or handed over by its loader) and leaves
as bands from a small pool, so memory holds one source tensor plus a few bands.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from guard.errors import GuardError
from guard.write.bitviews import numpy_dtype, storage_dtype
from guard.write.cast import CastCheck
from guard.write.sink import DEPTH, OutputStream
from guard.write.transpose import BAND_BYTES, bit_view, permuted_bands, reduce_perm

if TYPE_CHECKING:
    import numpy as np

    from guard.write.plan import SourceTensor

Piece = tuple[Any, ...]


def read_into(fh: Any, view: memoryview) -> int:
    """Fill ``view`` from ``fh``'s position; the bytes read, fewer only where the file ended."""
    done = 0
    while done < len(view):  # readinto may return short reads above 2 GiB
        n = fh.readinto(view[done:])
        if not n:
            break
        done += n
    return done


class BandPool:
    """DEPTH + 1 reusable band buffers: the writer gives each back once it is written."""

    def __init__(self, count: int = DEPTH + 1) -> None:
        self._free: queue.Queue[Any] = queue.Queue()
        for _ in range(count):
            self._free.put(None)  # allocated on first use, at the size first asked for

    def take(self, nbytes: int) -> np.ndarray:
        import numpy as np

        buffer = self._free.get()
        if buffer is None or buffer.size < nbytes:
            buffer = np.empty(max(nbytes, BAND_BYTES), np.uint8)
        return buffer

    def give(self, buffer: np.ndarray) -> Callable[[], None]:
        return lambda: self._free.put(buffer)


class SourceBuffer:
    """Ranged source tensors, mapped read-only (no copy out of the page cache), or read into one buffer.

    The mapping is what safetensors' own loader and ``torch.load(mmap=True)`` do; it lives as long as
    the arrays made from it (the transposer copies out of it before the next tensor is mapped).  The
    range was checked against the file size by the reader; where mapping is refused (a pipe, an odd
    file system) the bytes are read into one buffer grown to the largest tensor.
    """

    def __init__(self) -> None:
        self._buffer: Any = None

    def read(self, tensor: SourceTensor, dtype: np.dtype[Any] | None = None) -> np.ndarray:
        """The tensor in ``dtype`` (by default its stored bits: numpy's integers for bf16 and fp8)."""
        import numpy as np

        info = tensor.info
        assert info.data_start is not None and info.data_end is not None
        size = info.data_end - info.data_start
        dtype = storage_dtype(info.dtype) if dtype is None else dtype
        if not size:
            return np.empty(info.shape, dtype)
        with open(info.file, "rb", buffering=0) as fh:
            if os.fstat(fh.fileno()).st_size < info.data_end:  # it shrank since its header was read
                raise GuardError(f"{info.file}: {info.name} is truncated; nothing written")
            try:
                return _mapped(fh.fileno(), info.data_start, size).view(dtype).reshape(info.shape)
            except (OSError, ValueError, TypeError):  # no mmap here (a pipe, Windows' signature, ...)
                return self._read(fh, info.data_start, size).view(dtype).reshape(info.shape)

    def _read(self, fh: Any, start: int, size: int) -> np.ndarray:
        import numpy as np

        if self._buffer is None or self._buffer.size < size:
            self._buffer = None  # free the old one before allocating the larger
            self._buffer = np.empty(size, np.uint8)
        view = memoryview(self._buffer)[:size]
        fh.seek(start)
        done = read_into(fh, view)
        if done < size:
            raise GuardError(f"{fh.name}: the file ended {size - done} bytes early; nothing written")
        return self._buffer[:size]


def _mapped(fd: int, start: int, size: int) -> np.ndarray:
    """``size`` bytes of the file from ``start``, mapped and prefaulted in one call (MAP_POPULATE)."""
    import mmap

    import numpy as np

    skip = start % mmap.ALLOCATIONGRANULARITY
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    mapping = mmap.mmap(fd, size + skip, flags=flags, prot=mmap.PROT_READ, offset=start - skip)
    return np.frombuffer(mapping, np.uint8, size, skip)


def ranged(tensor: SourceTensor) -> bool:
    """Its bytes are one C-ordered range of its file, readable without its framework."""
    info = tensor.info
    return info.data_start is not None and info.data_end is not None and info.stride is None


def moves(shape: tuple[int, ...], perm: tuple[int, ...] | None) -> bool:
    """Whether ``perm`` changes the byte order (transposing a [1, N] matrix does not)."""
    if perm is None:
        return False
    order = reduce_perm(shape, perm)[1]
    return order != tuple(range(len(order)))


def body_pieces(tensor: SourceTensor, perm: tuple[int, ...] | None, code: str, *, pool: BandPool,
                source: SourceBuffer, check: CastCheck | None) -> Iterator[Piece]:
    """The output bytes of ``tensor`` permuted by ``perm`` and stored as ``code``, in order."""
    info = tensor.info
    permute = moves(info.shape, perm)
    if check is None and not permute and ranged(tensor):
        assert info.data_start is not None and info.data_end is not None
        yield ("range", info.file, info.data_start, info.data_end - info.data_start)
        return
    # values (ml_dtypes' floats) only where a cast computes with them; elsewhere bits move as integers
    real = numpy_dtype(info.dtype) if check is not None and ranged(tensor) else None
    try:
        array = source.read(tensor, real) if ranged(tensor) else tensor.load()
    except OSError as exc:  # a shard deleted or unmounted mid-conversion
        raise GuardError(f"{info.file}: cannot read {tensor.name} ({exc.strerror or exc}); nothing written") from None
    bits = bit_view(array)
    if not permute:
        flat = bits.reshape(-1)
        step = max(1, BAND_BYTES // max(1, bits.itemsize))
        for start in range(0, flat.size, step):
            piece = flat[start:start + step]
            if check is not None:
                yield ("bytes", bit_view(check.cast(piece.view(array.dtype))), None)
            else:
                yield ("bytes", piece, None)  # a loader's own array (never the shared buffer), alive until written
        return
    current: list[np.ndarray] = []
    itemsize, kind = bits.itemsize, bits.dtype

    def buffer(n: int) -> np.ndarray:
        current[:] = [pool.take(n * itemsize)]
        return current[0][:n * itemsize].view(kind)

    for band in permuted_bands(bits, perm, buffer):
        release = pool.give(current[0])
        if check is not None:
            out = bit_view(check.cast(band.view(array.dtype)))
            release()
            yield ("bytes", out, None)
        else:
            yield ("bytes", band, release)
    del array, bits


class PieceCutter:
    """Cuts a tensor's piece stream at segment boundaries (flax's 1 GiB chunks)."""

    def __init__(self, pieces: Iterator[Piece], name: str) -> None:
        self.pieces, self.name = pieces, name
        self.pending: Piece | None = None

    def emit(self, size: int, stream: OutputStream) -> None:
        """Queue exactly ``size`` more bytes of the tensor (splitting a piece where a segment ends)."""
        while size:
            piece = self.pending or next(self.pieces, None)
            self.pending = None
            if piece is None:
                raise AssertionError(f"{self.name}: produced fewer bytes than planned")
            length = piece[3] if piece[0] == "range" else memoryview(piece[1]).nbytes
            if length > size:
                head, self.pending = _split(piece, size)
                piece, length = head, size
            if piece[0] == "range":
                stream.copy_range(piece[1], piece[2], piece[3])
            else:
                stream.write(piece[1], piece[2])
            size -= length

    def done(self) -> None:
        extra = self.pending or next(self.pieces, None)
        if extra is not None and (extra[3] if extra[0] == "range" else memoryview(extra[1]).nbytes):
            raise AssertionError(f"{self.name}: produced more bytes than planned")


def _split(piece: Piece, size: int) -> tuple[Piece, Piece]:
    if piece[0] == "range":
        _, path, start, length = piece
        return ("range", path, start, size), ("range", path, start + size, length - size)
    view = memoryview(piece[1]).cast("B")
    return ("bytes", view[:size], None), ("bytes", view[size:], piece[2])  # released with its last part
