"""``diff --values``: tensor data of the two sides, compared in bounded chunks.

Bytes first: two tensors whose bytes are equal are unchanged, and comparing bytes costs a memcmp
(``os.pread`` into 1 MiB ``bytes`` objects: a ``memoryview`` comparison walks element by element
and runs six times slower).  Only chunks that differ, or tensors whose dtype changed, are decoded
(numpy; float32 as torch promotes them, float64 for fp64 and wide integers) for the largest
absolute difference; the tensor's own scale (max |old|) is read
for those tensors alone.  Files of equal size on a shared layout are compared whole first: a
re-save that changed nothing costs one read of both sides and no decoding, and two names for one
file (the same inode) cost nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from math import prod

from guard.errors import MissingExtraError
from guard.records import Record
from guard.tensors import TensorInfo

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a diff imports no typing
    from typing import Any

CHUNK_BYTES = 1024 * 1024
WORKERS = min(4, os.cpu_count() or 1)
_INTS = {"I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64", "U8": "uint8", "U16": "uint16",
         "U32": "uint32", "U64": "uint64", "BOOL": "bool"}


class ValueResult(Record):
    identical: bool | None  # None: not compared (``reason`` says why)
    max_abs: float | None = None
    max_rel: float | None = None
    overlap: int | None = None  # leading rows compared when only the first dimension changed
    reason: str | None = None


def require_values_extra() -> None:
    for module in ("numpy", "ml_dtypes"):
        try:
            __import__(module)
        except ImportError:
            raise MissingExtraError(module, "values") from None


def compare_values(pairs: Sequence[tuple[TensorInfo, TensorInfo]]) -> list[ValueResult]:
    """One result per (old, new) pair, in order; files and tensors are read on a few threads."""
    require_values_extra()
    results: list[ValueResult | None] = [None] * len(pairs)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        identical_files = _identical_prefixes(pairs, pool)
        jobs = []
        for i, (old, new) in enumerate(pairs):
            prefix = identical_files.get((old.file, new.file))
            if prefix is not None and _same_layout(old, new) and old.data_end is not None and old.data_end <= prefix:
                results[i] = ValueResult(True, 0.0, 0.0)  # inside the equal prefix of two files of one layout
            else:
                jobs.append(i)
        for i, result in zip(jobs, pool.map(lambda i: compare_pair(*pairs[i]), jobs)):
            results[i] = result
    return [r if r is not None else ValueResult(None, reason="not compared") for r in results]


def locate(pairs: Sequence[tuple[TensorInfo, TensorInfo]]) -> list[tuple[TensorInfo, TensorInfo]]:
    """The pairs, with a torch zip that was scanned without placing its storages read again to place them."""
    unplaced = {t.file for pair in pairs for t in pair if t.data_start is None}
    placed: dict[tuple[str, str], TensorInfo] = {}
    for path in unplaced:
        placed.update(((path, t.name), t) for t in _placed_torch_zip(path))
    if not placed:
        return list(pairs)
    return [(placed.get((o.file, o.name), o), placed.get((n.file, n.name), n)) for o, n in pairs]


def _placed_torch_zip(path: str) -> Sequence[TensorInfo]:
    from guard.readers import READ_FAILURES, sniff_format
    from guard.sources import LocalFile

    failures: tuple[type[BaseException], ...] = (OSError, *READ_FAILURES)
    try:
        with LocalFile(path, name=path) as source:
            if sniff_format(source) != "torch-zip":
                return ()
            from guard.readers.torch.zip import read_torch_zip

            return read_torch_zip(source, locate_data=True).tensors
    except failures:
        return ()  # its tensors stay unplaced: "not compared"


def _same_layout(old: TensorInfo, new: TensorInfo) -> bool:
    return (old.data_start, old.data_end, old.dtype, old.shape) == (new.data_start, new.data_end, new.dtype, new.shape)


def _identical_prefixes(pairs: Sequence[tuple[TensorInfo, TensorInfo]], pool: ThreadPoolExecutor
                        ) -> dict[tuple[str, str], int]:
    """(old file, new file) -> how many leading bytes the two files share, for files of equal size
    whose paired tensors sit at the same offsets (a re-save, a copy, a fine-tune of some layers)."""
    by_files: dict[tuple[str, str], bool] = {}
    for old, new in pairs:
        key = (old.file, new.file)
        by_files[key] = by_files.get(key, True) and _same_layout(old, new)
    candidates = [key for key, same in by_files.items() if same]
    found = dict(zip(candidates, pool.map(lambda key: _shared_bytes(*key), candidates)))
    return {key: n for key, n in found.items() if n is not None}


def _shared_bytes(old_file: str, new_file: str) -> int | None:
    try:
        a, b = os.stat(old_file), os.stat(new_file)
        if a.st_size != b.st_size:
            return None
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return a.st_size  # one file under two names
        return _common_prefix(old_file, new_file, a.st_size)
    except OSError:
        return None


def _common_prefix(old_file: str, new_file: str, size: int) -> int:
    fa, fb = _open(old_file), _open(new_file)
    left, right = _buffers()
    try:
        pos = 0
        while pos < size:
            want = min(CHUNK_BYTES, size - pos)
            if not _same_chunk(fa, fb, pos, pos, want, want, left, right):
                return pos
            pos += want
        return pos
    finally:
        os.close(fa)
        os.close(fb)


_local = threading.local()


def _buffers() -> tuple[bytearray, bytearray]:
    """This thread's two read buffers, reused: a fresh ``bytes`` per read costs its page faults."""
    if not hasattr(_local, "buffers"):
        _local.buffers = (bytearray(CHUNK_BYTES), bytearray(CHUNK_BYTES))
    return _local.buffers


def _fill(fd: int, buffer: bytearray, offset: int, size: int) -> memoryview:
    view = memoryview(buffer)[:size]
    got = os.preadv(fd, [view], offset)
    if got != size:
        raise OSError(0, f"short read at byte {offset + got:,}: the file changed while it was read?")
    return view


def _same_chunk(fa: int, fb: int, a_at: int, b_at: int, a_size: int, b_size: int,
                left: bytearray, right: bytearray) -> bool:
    """Read both chunks into the buffers; whether their bytes are equal (a memcmp: bytearrays compare
    with one, where memoryviews walk element by element)."""
    _fill(fa, left, a_at, a_size)
    _fill(fb, right, b_at, b_size)
    if a_size != b_size:
        return False
    if a_size == CHUNK_BYTES:
        return left == right
    return left[:a_size] == right[:b_size]


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))


def comparable(info: TensorInfo) -> str | None:
    """Why the tensor's bytes cannot be read by range, or None."""
    if info.data_start is None or info.data_end is None:
        return "the reader did not place this tensor's bytes"
    if info.stride is not None:
        return "a strided view"
    if info.nbytes is None or info.data_end - info.data_start != info.nbytes:
        return "its byte range does not match its dtype and shape"
    return None


def compare_pair(old: TensorInfo, new: TensorInfo) -> ValueResult:
    if old.data_start is None or new.data_start is None:
        from guard.convert.training.values import compare_assembled, is_assembled  # a training checkpoint's tensors

        if is_assembled(old) or is_assembled(new):
            identical, max_abs, max_rel, why = compare_assembled(old, new)
            return ValueResult(identical, max_abs, max_rel, reason=why)
    reason = comparable(old) or comparable(new)
    if reason is not None:
        return ValueResult(None, reason=reason)
    rows = None
    if old.shape == new.shape:
        count = old.numel
    elif old.dtype == new.dtype and len(old.shape) == len(new.shape) >= 1 and old.shape[1:] == new.shape[1:]:
        rows = min(old.shape[0], new.shape[0])
        count = rows * prod(old.shape[1:])
    else:
        return ValueResult(None, reason="shapes differ")
    try:
        fa, fb = _open(old.file), _open(new.file)
    except OSError as exc:
        return ValueResult(None, reason=f"not a local file ({exc.strerror})")
    try:
        return _compare_open(fa, fb, old, new, count)._replace(overlap=rows)
    except OSError as exc:
        return ValueResult(None, reason=f"read failed ({exc.strerror})")
    finally:
        os.close(fa)
        os.close(fb)


def _compare_open(fa: int, fb: int, old: TensorInfo, new: TensorInfo, count: int) -> ValueResult:
    assert old.data_start is not None and new.data_start is not None
    old_dtype, new_dtype = _numpy_dtype(old.dtype), _numpy_dtype(new.dtype)
    if old.dtype != new.dtype and (old_dtype is None or new_dtype is None):
        return ValueResult(False, reason=f"{old.dtype} and {new.dtype} values are not decoded")
    old_size, new_size = _itemsize(old, old_dtype), _itemsize(new, new_dtype)
    wide = _wide(old.dtype) or _wide(new.dtype)
    step = max(1, CHUNK_BYTES // max(old_size, new_size))
    left, right = _buffers()
    figures = _Figures()
    differs = False
    unscaled: list[tuple[int, int]] = []  # chunks whose values equal: their scale is needed only if others differ
    for at in range(0, count, step):
        k = min(step, count - at)
        a_at, b_at = old.data_start + at * old_size, new.data_start + at * new_size
        if _same_chunk(fa, fb, a_at, b_at, k * old_size, k * new_size, left, right) and old.dtype == new.dtype:
            unscaled.append((at, k))
            continue
        differs = True
        if old_dtype is None or new_dtype is None:
            return ValueResult(False, reason=f"{old.dtype} values are not decoded")
        if not figures.update(_decode(left, old.dtype, old_dtype, k, wide, slot=0),
                              _decode(right, new.dtype, new_dtype, k, wide, slot=1)):
            unscaled.append((at, k))  # an exact cast (bf16 -> fp32): no difference yet to scale
    if not differs:
        return ValueResult(True, 0.0, 0.0)
    if figures.max_abs:
        for at, k in unscaled:
            _fill(fa, left, old.data_start + at * old_size, k * old_size)
            figures.scale(_decode(left, old.dtype, old_dtype, k, wide, slot=0))
    return ValueResult(False, figures.max_abs, figures.max_rel())


def _wide(code: str) -> bool:
    """Values float32 cannot hold exactly: compared in float64."""
    return code in ("F64", "I32", "I64", "U32", "U64")


def _numpy_dtype(code: str) -> Any:
    import numpy as np

    if code in _INTS:
        return np.dtype(_INTS[code])
    from guard.values.stats import _ML_NAMES, numpy_dtype

    if code in ("F16", "F32", "F64") or code in _ML_NAMES:
        return numpy_dtype(code)
    return None  # block-quantized, sub-byte or unknown codes: bytes only


def _itemsize(info: TensorInfo, dtype: Any) -> int:
    if dtype is not None:
        return int(dtype.itemsize)
    return max(1, (info.nbytes or 0) // max(1, info.numel))


def _decode(buffer: bytearray, code: str, dtype: Any, count: int, wide: bool, *, slot: int) -> Any:
    """The chunk's values as float32 (float64 where either side is wide): what torch's type promotion
    computes a difference in.  Into this thread's scratch arrays (a fresh 2 MiB array per chunk costs
    its page faults); fp32 is read in place, bf16 widens by a shift of its bits (ten times faster
    than a cast through ml_dtypes)."""
    import numpy as np

    target = np.float64 if wide else np.float32
    raw = np.frombuffer(buffer, dtype, count=count)
    if raw.dtype == target:
        return raw
    out = _scratch(slot, target, count)
    if code == "BF16" and not wide:
        bits = out.view(np.uint32)
        np.copyto(bits, raw.view(np.uint16), casting="unsafe")
        np.left_shift(bits, 16, out=bits)
        return out
    np.copyto(out, raw, casting="unsafe")
    return out


def _scratch(slot: int, dtype: Any, count: int) -> Any:
    """Scratch arrays of this thread: slots 0 and 1 hold the two sides' values, 2 their difference;
    each as long as the longest chunk so far (at most CHUNK_BYTES elements, for 1-byte dtypes)."""
    import numpy as np

    key = (slot, np.dtype(dtype).char)
    arrays = _local.__dict__.setdefault("arrays", {})
    if key not in arrays or arrays[key].size < count:
        arrays[key] = np.empty(count, dtype=dtype)
    return arrays[key][:count]


class _Figures:
    """Running max |new - old| and max |old|; NaN positions are left out of both."""

    def __init__(self) -> None:
        self.max_abs = 0.0
        self.old_scale = 0.0

    def update(self, old: Any, new: Any) -> bool:
        """Take one chunk; False when its values are equal (its scale is then left for later)."""
        import numpy as np

        diff = _scratch(2, old.dtype, old.size)
        with np.errstate(invalid="ignore", over="ignore"):
            np.subtract(new, old, out=diff, dtype=old.dtype)
            np.abs(diff, out=diff)
        peak = _nanmax(diff)
        if not peak:
            return False
        self.max_abs = max(self.max_abs, peak)
        self.scale(old)
        return True

    def scale(self, old: Any) -> None:
        import numpy as np

        magnitude = _scratch(2, old.dtype, old.size)
        np.abs(old, out=magnitude)
        self.old_scale = max(self.old_scale, _nanmax(magnitude))

    def max_rel(self) -> float | None:
        if self.old_scale == 0.0:
            return None if self.max_abs else 0.0
        return self.max_abs / self.old_scale


def _nanmax(values: Any) -> float:
    import numpy as np

    if values.size == 0:
        return 0.0
    peak = np.fmax.reduce(values)  # fmax skips NaN; all-NaN gives NaN
    return 0.0 if np.isnan(peak) else float(peak)
