"""Streaming value statistics for one tensor, computed on raw bits.

A float's magnitude is its bit pattern with the sign bit cleared, and for IEEE
formats (fp16, bf16, fp32, fp64) magnitudes order like unsigned integers.  So
max |x|, min non-zero |x|, NaN/Inf counts and "beyond the fp16 range" are
integer comparisons on a ``uint`` view: no float conversion on the hot path.
Only the rare values near a target's range limits, and the rounding error of a
requested narrower cast (CG204), are ever converted.

bf16 and fp8 values come from their bits (``guard.values.minifloats``), not from ml_dtypes, whose
import cost more than a scan's work; ``numpy_dtype`` (ml_dtypes' types) is for other callers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from guard.records import Record
from guard.values.minifloats import cast_back, float32_table, itemsize, largest, smallest_normal, to_float32

# Source dtypes read on their own bits: code -> (uint view, magnitude mask, +inf bits).
IEEE_BITS: dict[str, tuple[type, int, int]] = {
    "F16": (np.uint16, 0x7FFF, 0x7C00),
    "BF16": (np.uint16, 0x7FFF, 0x7F80),
    "F32": (np.uint32, 0x7FFF_FFFF, 0x7F80_0000),
    "F64": (np.uint64, 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000),
}
# Read by converting each chunk to fp32 first (exact: every value fits in fp32).
WIDENED_TO_F32 = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0")
# Dtypes a value can be cast *to* (CG201/CG202/CG204).  E8M0 holds scales, F4/F6 packed codes.
SLICE = 1 << 20  # elements per slice where every value is converted (bounded temporaries)
CAST_TARGETS = ("F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")


def numpy_dtype(code: str) -> np.dtype[Any]:
    """The numpy dtype of a float code (ml_dtypes' for bf16 and fp8: imported here, off the scan's path)."""
    names = {"F16": "float16", "F32": "float32", "F64": "float64"}
    if code in names:
        return np.dtype(names[code])
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, _ML_NAMES[code]))


_ML_NAMES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
             "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
             "F8_E8M0": "float8_e8m0fnu"}


def every_value(source: str) -> Any:
    """The value of every bit pattern of a source of at most 16 bits, as float64 (NaNs and
    infinities included; exact: every such value fits in fp32)."""
    with np.errstate(invalid="ignore"):  # NaN patterns
        return to_float32(source, every_bits(source)).astype(np.float64)


def every_bits(source: str) -> Any:
    size = itemsize(source)
    return np.arange(2 ** (8 * size), dtype=np.uint32).astype(np.uint16 if size == 2 else np.uint8)


def value_of_bits(code: str, bits: int) -> float:
    """One IEEE kernel pattern (F16, BF16, F32, F64) as a Python float."""
    return float(kernel_values(code, np.array([bits], dtype=IEEE_BITS[code][0]))[0])


@cache
def cast_is_exact(source: str, target: str) -> bool:
    """True when every finite value of ``source`` survives a cast to ``target`` unchanged."""
    if source == target:
        return True
    if itemsize(source) <= 2:  # enumerate every bit pattern
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            values = every_value(source)
            values = values[np.isfinite(values)]
            back = cast_back(values, target)
        return bool(np.array_equal(values, back))
    return (source, target) == ("F32", "F64")


@cache
def rounds_in_range(source: str, target: str) -> bool:
    """True when some ``source`` value inside ``target``'s normal range changes on the cast
    (bf16 -> fp16 loses only at the range ends: CG201/CG202, never CG204)."""
    if cast_is_exact(source, target):
        return False
    if itemsize(source) > 2:
        return True
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        values = every_value(source)
        values = values[(np.abs(values) >= smallest_normal(target)) & (np.abs(values) <= largest(target))]
        return not np.array_equal(values, cast_back(values, target))


class CastLimits(Record):
    """A target's limits in a source's magnitude bits: at or above ``overflow`` -> non-finite,
    below ``normal`` -> subnormal or zero in the target."""

    target: str
    overflow: int
    normal: int


@cache
def cast_limits(source: str, target: str) -> CastLimits:
    _uint, _mask, inf_bits = IEEE_BITS[source]
    tiny = smallest_normal(target)

    def value(bits: int) -> float:
        return value_of_bits(source, bits)

    def overflows(bits: int) -> bool:  # float64 holds every source value exactly
        with np.errstate(over="ignore", invalid="ignore"):
            return not np.isfinite(cast_back(np.array([value(bits)], dtype=np.float64), target)[0])

    return CastLimits(target, _first_true(overflows, inf_bits), _first_true(lambda b: value(b) >= tiny, inf_bits))


def _first_true(predicate: Any, hi: int) -> int:
    """Smallest bits in [0, hi] where a monotonic predicate holds (hi if none before it)."""
    lo = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if predicate(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@cache
def underflow_table(source: str, target: str) -> Any:
    """For a 16-bit source, each bit pattern's fate in ``target``'s subnormal range: 1 flushes to
    zero, 2 survives rounded, 0 neither (zero, exact, or not below ``target``'s smallest normal).

    A lookup per tiny value instead of casting them (the same fate per bit pattern, without the
    casts' temporaries and calls).
    """
    uint, mask, _inf = IEEE_BITS[source]
    values = every_value(source)
    mag = every_bits(source) & uint(mask)
    with np.errstate(all="ignore"):  # NaN patterns compare unequal, and are not tiny
        back = cast_back(values, target)
        changed = back != values
    tiny = (mag != 0) & (mag < cast_limits(source, target).normal)
    flushed = tiny & (back == 0)
    table = np.zeros(1 << 16, np.uint8)
    table[tiny & changed & ~flushed] = 2
    table[flushed] = 1
    return table


@cache
def underflow_reach(source: str, target: str) -> int:
    """One past the largest magnitude whose ``underflow_table`` entry counts (bf16 -> fp16: 2^-17)."""
    mask = IEEE_BITS[source][1]
    return int((np.flatnonzero(underflow_table(source, target)) & mask).max(initial=0)) + 1


@dataclass  # mutable: the band loop adds each band's overflows, flushes and errors
class CastStats:
    """What casting one tensor to ``target`` would do."""

    target: str
    overflow: int = 0  # values that become inf (or NaN in the fn formats)
    flush: int = 0  # non-zero values that become zero
    inexact_subnormal: int = 0  # tiny values that survive, rounded
    max_rel_error: float = 0.0  # over values in the target's normal range (CG204)
    worst_rel_value: float | None = None
    rounded: int = 0  # values in the normal range that change
    underflow_counted: bool = True  # False: a cast not in play, its overflows alone counted (flush: null)

    def to_json(self) -> dict[str, Any]:
        counted = self.underflow_counted
        return {"overflow": self.overflow, "flush": self.flush if counted else None,
                "inexact_subnormal": self.inexact_subnormal if counted else None, "rounded": self.rounded,
                "max_rel_error": self.max_rel_error, "worst_rel_value": self.worst_rel_value}


@dataclass  # mutable: the band loop adds counts and moves the extreme bits band by band
class TensorStats:
    dtype: str
    numel: int = 0
    nan: int = 0
    inf: int = 0
    max_bits: int = -1  # magnitude bits of the largest finite |x|
    worst_bits: int = 0  # the same value with its sign
    min_bits: int = -1  # magnitude bits of the smallest non-zero finite |x|
    casts: dict[str, CastStats] = field(default_factory=dict)
    kernel: str = ""  # the IEEE dtype the bits were read as

    def value_of(self, bits: int) -> float:
        return value_of_bits(self.kernel, bits)

    @property
    def max_abs(self) -> float | None:
        return self.value_of(self.max_bits) if self.max_bits >= 0 else None

    @property
    def worst_value(self) -> float | None:
        return self.value_of(self.worst_bits) if self.max_bits >= 0 else None

    @property
    def min_nonzero_abs(self) -> float | None:
        return self.value_of(self.min_bits) if self.min_bits > 0 else None


class Scratch:
    """Work arrays reused across chunks and tensors: fresh chunk-sized temporaries
    cost more in page faults than the arithmetic on them."""

    def __init__(self) -> None:
        self._arrays: dict[Any, tuple[Any, Any, Any, Any]] = {}

    def arrays(self, uint: Any, size: int) -> tuple[Any, Any, Any, Any]:
        """Magnitudes, flags, one flag per group of four elements, and magnitudes less one."""
        held = self._arrays.get(uint)
        if held is None or held[0].size < size:
            held = (np.empty(size, uint), np.empty(size, np.bool_), np.empty(size // 4 + 1, np.bool_),
                    np.empty(size, uint))
            self._arrays[uint] = held
        return held[0][:size], held[1][:size], held[2], held[3]


def flagged_groups(bits: Any, flags: Any, groups: Any) -> Any:
    """Every flagged value of ``bits``, with the others of its group of four.

    For few flags (tiny values): boolean indexing walks the flags twice, one element at a time;
    four flags read as one uint32 find the groups in a quarter of the steps, and 16-bit values
    come out as whole 8-byte words.  Callers filter by magnitude again where it matters.
    """
    if bits.size % 4:
        return bits[flags]
    hits = np.not_equal(flags.view(np.uint32), 0, out=groups[: bits.size // 4]).nonzero()[0]
    if bits.itemsize == 2:
        return bits.view(np.uint64)[hits].view(bits.dtype)
    return bits.reshape(-1, 4)[hits].ravel()


class TensorScanner:
    """Feed raw chunks of one tensor (whole elements) to ``update``; read ``finish()``.

    ``range_targets`` get overflow/underflow counts (cheap: only values past a
    limit are touched); ``rounding_targets`` also get the relative rounding error,
    which converts every value and costs a few passes per chunk.

    A chunk costs three passes on the common path: magnitudes, their maximum, and the flags of
    the tiny values (under 2^-14; from bf16 under 2^-17, the only ones casting to fp16 can lose).
    Those few, gathered with their neighbours, wait in a batch of up to ``BATCH`` elements: numpy's
    cost per call on the few dozen of one chunk outweighed its passes over the whole chunk.  The
    batch gives min |x| and every underflow whose range ends at or below 2^-14.
    """

    BATCH = 1 << 16

    def __init__(self, dtype: str, *, range_targets: tuple[str, ...], rounding_targets: tuple[str, ...],
                 underflow_targets: tuple[str, ...] | None = None) -> None:
        """``underflow_targets``: the range targets whose underflows are counted (default: every one); the
        others get their overflow count alone (a figure that costs nothing unless values reach the limit)."""
        self.kernel = "F32" if dtype in WIDENED_TO_F32 else dtype
        if self.kernel not in IEEE_BITS:
            raise ValueError(f"no value kernel for {dtype}")
        self.source = dtype
        self.stats = TensorStats(dtype, kernel=self.kernel)
        wanted = dict.fromkeys(range_targets + rounding_targets)
        self.limits = [cast_limits(self.kernel, t) for t in wanted if not cast_is_exact(dtype, t)]
        self.rounding = {t for t in rounding_targets if rounds_in_range(dtype, t)}
        counted = set(wanted if underflow_targets is None else underflow_targets + rounding_targets)
        for limit in self.limits:
            self.stats.casts[limit.target] = CastStats(limit.target, underflow_counted=limit.target in counted)
        self.uint, self.mask, self.inf_bits = IEEE_BITS[self.kernel]
        small = cast_limits(self.kernel, "F16").normal  # |x| < 2^-14: few in real weights
        under = [limit for limit in self.limits if limit.target in counted]
        self._tiny = [limit for limit in under if limit.normal <= small]  # from the batch alone
        self._wide = [limit for limit in under if limit.normal > small]  # fp8 targets: every chunk
        self._tables = {limit.target: underflow_table(self.kernel, limit.target) for limit in self._tiny
                        if self.uint is np.uint16}
        if self._tables:  # gather only as far up as a table has something to count: 8x fewer values
            small = max(underflow_reach(self.kernel, target) for target in self._tables)
        # Magnitudes below this are gathered; once a non-zero one is seen, no other can be the smallest.
        # Only an underflow count needs the tiny values themselves: with no such target in play nothing
        # is gathered, and each chunk's own minimum gives the smallest (two passes fewer per chunk).
        self._gather = bool(self._tiny)
        self.tiny_below = small if self._gather else 0
        # Nothing gathered, nothing converted: a read's figures come from four reductions (``_update_fast``).
        self._fast = not (self._gather or self._wide or self.rounding or self.source in WIDENED_TO_F32)
        self._signed = np.dtype(np.dtype(self.uint).str.replace("u", "i"))  # int16 for uint16, ...
        self._sign = 1 << (8 * np.dtype(self.uint).itemsize - 1)
        self._mask, self._small, self._one = self.uint(self.mask), self.uint(small), self.uint(1)
        self._top = int(np.iinfo(self.uint).max)
        self._batch: list[Any] = []
        self._batched = 0

    def update_read(self, raw: memoryview, scratch: Scratch, chunk: int) -> None:
        """One read of whole elements: on the fast path in one go, else in ``chunk``-byte pieces (``update``)."""
        if not (self._fast and self._update_fast(raw)):
            for at in range(0, len(raw), chunk):
                self.update(raw[at:at + chunk], scratch)

    def _update_fast(self, raw: memoryview) -> bool:
        """Four reductions on the bits, nothing written: False (and nothing counted) where the slow path must look.

        As unsigned integers the positive values order by magnitude below the negative ones; as signed integers
        the negative ones order by magnitude from the most negative integer up.  So the largest unsigned is the
        largest negative magnitude (with the sign bit), the largest signed the largest positive, the smallest
        unsigned the smallest positive and the smallest signed the smallest negative: max |x| and min |x| without
        a magnitude array.  A zero, a NaN or Inf, a value past a target's range: the slow path, for this read.
        """
        bits: Any = np.frombuffer(raw, dtype=self.uint)
        if bits.size == 0:
            return True
        signed = bits.view(self._signed)
        umax, umin, smax, smin = int(bits.max()), int(bits.min()), int(signed.max()), int(signed.min())
        sign = self._sign
        if umin == 0 or smin == -sign:  # +0.0 or -0.0: the smallest non-zero needs the magnitudes
            return False
        pos_top = smax if smax >= 0 else -1
        neg_top = umax - sign if umax >= sign else -1
        top = max(pos_top, neg_top)
        if top >= self.inf_bits or any(top >= limit.overflow for limit in self.limits):
            return False
        st = self.stats
        if top > st.max_bits:
            if pos_top == neg_top:  # both signs reach it: the first one's sign, as argmax gives it
                return False
            st.max_bits, st.worst_bits = top, (top if pos_top == top else umax)
        low = min(umin if umin < sign else self._top, smin + sign if smin < 0 else self._top)
        if st.min_bits < 0 or low < st.min_bits:
            st.min_bits = low
        st.numel += bits.size
        return True

    def update(self, raw: memoryview | bytes, scratch: Scratch) -> None:
        if self.source in WIDENED_TO_F32:  # each byte's fp32 bits, from a 256-entry table
            bits = float32_table(self.source).take(np.frombuffer(raw, dtype=np.uint8))
        else:
            bits = np.frombuffer(raw, dtype=self.uint)
        if bits.size == 0:
            return
        st = self.stats
        st.numel += bits.size
        mag, flags, groups, less_one = scratch.arrays(self.uint, bits.size)
        np.bitwise_and(bits, self._mask, out=mag)
        top = int(mag.max())
        if top >= self.inf_bits:  # NaN or Inf present: count them, go on with the finite rest
            inf = int(np.count_nonzero(np.equal(mag, self.inf_bits, out=flags)))
            finite = np.less(mag, self.inf_bits, out=flags)
            st.inf += inf
            st.nan += bits.size - inf - int(np.count_nonzero(finite))
            bits, mag = bits[finite], mag[finite]
            flags = flags[: mag.size]
            if mag.size == 0:
                return
            top = int(mag.max())
        if top > st.max_bits:  # the reported sign is the first largest value's (argmax)
            st.max_bits, st.worst_bits = top, int(bits[int(mag.argmax())])
        lowered = None  # |x| - 1, where needed: zero wraps to the largest uint, so zeros fall out of a "<"
        if self._gather:
            near = flagged_groups(bits, np.less(mag, self._small, out=flags), groups)
            if near.size > bits.size >> 3:  # mostly zeros flagged (a pruned, 2:4-sparse tensor): the tiny ones alone
                lowered = np.subtract(mag, self._one, out=less_one[:mag.size])
                near = flagged_groups(bits, np.less(lowered, self._small - self._one, out=flags), groups)
            if near.size:
                self._batch.append(near)
                self._batched += near.size
        if not 0 < st.min_bits < self.tiny_below:
            # No non-zero tiny value yet: this chunk's own smallest may be the tensor's.  Once one is
            # seen, only the batched values can beat it.
            self._settle()
            if not 0 < st.min_bits < self.tiny_below:
                low = int(mag.min())
                if not low:  # |x| - 1 wraps 0 to the largest uint, so zeros never win the min
                    if lowered is None:
                        lowered = np.subtract(mag, self._one, out=less_one[:mag.size])
                    low = (int(lowered.min()) + 1) & self._top
                if low and (st.min_bits < 0 or low < st.min_bits):
                    st.min_bits = low
        elif self._batched >= self.BATCH:
            self._settle()
        for limit in self.limits:
            if top >= limit.overflow:
                st.casts[limit.target].overflow += int(np.count_nonzero(
                    np.greater_equal(mag, limit.overflow, out=flags)))
        for limit in self._wide:  # a wider range than 2^-14: many values, one slice at a time
            for start in range(0, bits.size, SLICE):
                part, part_mag = bits[start:start + SLICE], mag[start:start + SLICE]
                tiny = part[(part_mag != 0) & (part_mag < limit.normal)]
                if tiny.size:
                    self._underflow(st.casts[limit.target], tiny)
        for target in self.rounding:
            self._rounding(cast_limits(self.kernel, target), bits, mag)

    def finish(self) -> TensorStats:
        self._settle()
        return self.stats

    def _settle(self) -> None:
        """The batched values: the smallest non-zero, and the underflows up to 2^-14."""
        if not self._batch:
            return
        near = self._batch[0] if len(self._batch) == 1 else np.concatenate(self._batch)
        self._batch, self._batched = [], 0
        near_mag = np.bitwise_and(near, self._mask)
        # |x| - 1 wraps 0 to the largest uint, so zeros never win the min
        low = (int(np.subtract(near_mag, self._one).min()) + 1) & self._top
        if not 0 < low < self.tiny_below:
            return  # zeros, and neighbours of theirs that are not tiny
        st = self.stats
        if st.min_bits < 0 or low < st.min_bits:
            st.min_bits = low
        for limit in self._tiny:
            if low >= limit.normal:
                continue
            cast = st.casts[limit.target]
            table = self._tables.get(limit.target)
            if table is not None:  # 16-bit sources: each tiny value's fate, looked up by its bits
                flushed, inexact = np.bincount(table.take(near), minlength=3)[1:].tolist()
                cast.flush += flushed
                cast.inexact_subnormal += inexact
            else:
                self._underflow(cast, near[(near_mag != 0) & (near_mag < limit.normal)])

    def _underflow(self, cast: CastStats, tiny: Any) -> None:
        values = kernel_values(self.kernel, tiny)
        with np.errstate(under="ignore"):
            back = cast_back(values, cast.target)
        flushed = int(np.count_nonzero(back == 0))
        cast.flush += flushed
        cast.inexact_subnormal += int(np.count_nonzero(back != values)) - flushed

    def _rounding(self, limit: CastLimits, bits: Any, mag: Any) -> None:
        # In slices: the float temporaries stay a few MiB whatever the chunk size.
        for start in range(0, bits.size, SLICE):
            self._rounding_slice(limit, bits[start:start + SLICE], mag[start:start + SLICE])

    def _rounding_slice(self, limit: CastLimits, bits: Any, mag: Any) -> None:
        cast = self.stats.casts[limit.target]
        in_range = (mag >= limit.normal) & (mag < limit.overflow)
        wide = np.float64 if self.kernel == "F64" else np.float32
        values = kernel_values(self.kernel, bits[in_range]).astype(wide)
        if values.size == 0:
            return
        err = np.abs(cast_back(values, limit.target) - values)
        cast.rounded += int(np.count_nonzero(err))
        rel = err / np.abs(values)
        index = int(rel.argmax())
        if float(rel[index]) > cast.max_rel_error:
            cast.max_rel_error, cast.worst_rel_value = float(rel[index]), float(values[index])


def kernel_values(kernel: str, bits: Any) -> Any:
    """An IEEE kernel's bits as values: a view for fp16/fp32/fp64, fp32 (exact) for bf16."""
    return to_float32(kernel, bits) if kernel == "BF16" else bits.view(numpy_dtype(kernel))
