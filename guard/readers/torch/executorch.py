"""ExecuTorch programs (``.pte``): constant tensors from the flatbuffer, header only.

A ``.pte`` is a flatbuffer ``Program`` (``executorch/schema/program.fbs``, file
identifier ``ET12`` at bytes 4-8), optionally followed by segments whose layout an
extended header (``eh00`` at byte 8: program size, segment base offset) gives.
Each ``ExecutionPlan`` (a method) lists its ``values``; an ``EValue`` holding a
``Tensor`` with a ``data_buffer_idx`` above 0 and no ``allocation_info`` is a
constant (a weight), whose ``scalar_type`` (``scalar_type.fbs``, c10's numbering),
``sizes`` and ``dim_order`` are in the table itself.  The weights keep no names, so a
tensor is named ``constant[<buffer index>]`` (its ``fully_qualified_name`` where the
program records one); a constant that two methods share is one tensor.  Its bytes
are placed from the constant segment (or the inline constant buffers) without
reading them, and must fit there.
"""

from __future__ import annotations

import struct

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import shown
from guard.readers.binary.flatbuffers import FlatBuffer
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

IDENTIFIER = b"ET12"
MAX_VALUES = 10_000_000
MAX_DIMS = 64
_TENSOR = 5  # KernelTypes: NONE, Null, Int, Bool, Double, Tensor, ...
# executorch/schema/scalar_type.fbs (c10::ScalarType numbering) -> dtype code; quantized ints are their bytes
SCALAR_TYPES: dict[int, str] = {
    0: "U8", 1: "I8", 2: "I16", 3: "I32", 4: "I64", 5: "F16", 6: "F32", 7: "F64", 11: "BOOL", 12: "I8",
    13: "U8", 14: "I32", 15: "BF16", 23: "F8_E5M2", 24: "F8_E4M3", 25: "F8_E5M2FNUZ", 26: "F8_E4M3FNUZ",
    27: "U16", 28: "U32", 29: "U64",
}
_NAMED_ONLY = {16: "quint4x2", 17: "quint2x4", 22: "bits16"}  # known to ExecuTorch, not a dtype here


def read_executorch(source: ByteSource) -> FileScan:
    head = source.read_at(0, min(source.size, 32))
    if head[4:8] != IDENTIFIER:
        raise MalformedCheckpoint(f"file identifier {head[4:8]!r} is not {IDENTIFIER!r}: not an ExecuTorch program "
                                  "this version reads")
    limit, segment_base = source.size, 0
    if head[8:12] == b"eh00" and len(head) >= 32:  # the extended header: the flatbuffer's own size
        _length, program_size, segment_base = struct.unpack_from("<IQQ", head, 12)
        if not 32 <= program_size <= source.size or segment_base > source.size:
            raise MalformedCheckpoint(f"extended header gives a program of {program_size:,} bytes and segments "
                                      f"from {segment_base:,} in a file of {source.size:,}")
        limit = program_size
    fb = FlatBuffer(source, limit=limit)
    program = fb.root()
    if fb.vector(program, 1, 4) is None:  # the runtime loads methods from the plans: nothing to run
        raise MalformedCheckpoint("the program has no execution plan")
    spans = _constant_spans(fb, program, segment_base, source.size)
    tensors: dict[str, TensorInfo] = {}
    unknown: dict[str, list[str]] = {}
    values = 0
    for plan in fb.tables(program, 1):
        found = fb.vector(plan, 2, 4)
        values += found[1] if found else 0
        if values > MAX_VALUES:
            raise MalformedCheckpoint(f"more than {MAX_VALUES:,} values in the execution plans")
        for evalue in fb.tables(plan, 2):
            if fb.scalar(evalue, 0, "B", 0) != _TENSOR:
                continue
            tensor = fb.table(evalue, 1)
            if tensor is None:
                raise MalformedCheckpoint("an EValue of type Tensor holds no tensor")
            buffer = int(fb.scalar(tensor, 5, "I", 0))
            if buffer == 0 or fb.table(tensor, 6) is not None:
                continue  # no data of its own, or planned memory: an activation, not a weight
            if buffer >= len(spans):
                raise MalformedCheckpoint(f"a constant tensor names buffer {buffer:,}, of {len(spans):,} "
                                          "in the program")
            info = _constant(fb, tensor, buffer, source.name, spans[buffer])
            if info.name not in tensors:
                tensors[info.name] = info
                if info.dtype not in dtypes.DTYPES:
                    unknown.setdefault(info.dtype, []).append(info.name)
    findings = tuple(make_finding("CG005", source.name, f"unknown dtype {code!r} on {len(names)} tensor(s), "
                                  f"e.g. {shown(names[0])}", tensor=names[0]) for code, names in unknown.items())
    return FileScan(path=source.name, format="executorch", size=source.size, tensors=tuple(tensors.values()),
                    findings=findings, bytes_read=getattr(source, "bytes_read", 0))


def _constant_spans(fb: FlatBuffer, program: int, segment_base: int, size: int) -> list[tuple[int, int]]:
    """Per constant buffer, the absolute (start, end) its bytes may use: from the constant segment
    (what ``serialize_pte_binary`` writes: ``constant_segment.offsets`` into ``segments[i]``, after
    the segment base), else from the inline ``constant_buffer[].storage`` vectors."""
    constant_segment = fb.table(program, 5)
    offsets = [int(n) for n in fb.numbers(constant_segment, 1, "Q")] if constant_segment is not None else []
    if constant_segment is None or not offsets:  # (no offsets without a constant segment)
        spans = []
        for buffer in fb.tables(program, 2):
            found = fb.vector(buffer, 0, 1)
            spans.append((found[0], found[0] + found[1]) if found else (0, 0))
        return spans
    index = int(fb.scalar(constant_segment, 0, "I", 0))
    segments = list(fb.tables(program, 4))
    if index >= len(segments):
        raise MalformedCheckpoint(f"the constant segment is segment {index:,}, of {len(segments):,}")
    start = segment_base + int(fb.scalar(segments[index], 0, "Q", 0))
    end = start + int(fb.scalar(segments[index], 1, "Q", 0))
    if end > size:
        raise MalformedCheckpoint(f"the constant segment ends at {end:,}, past the end of the file ({size:,} bytes)")
    if any(not 0 <= offset <= end - start for offset in offsets):
        raise MalformedCheckpoint("a constant's offset lies outside the constant segment")
    return [(start + offset, end) for offset in offsets]


def _constant(fb: FlatBuffer, tensor: int, buffer: int, path: str, span: tuple[int, int]) -> TensorInfo:
    code = int(fb.scalar(tensor, 0, "b", 0))
    dtype = SCALAR_TYPES.get(code) or _NAMED_ONLY.get(code) or f"scalar_type {code}"
    found = fb.vector(tensor, 2, 4)
    if found is not None and found[1] > MAX_DIMS:
        raise MalformedCheckpoint(f"a constant tensor has {found[1]:,} dims")
    shape = tuple(int(n) for n in fb.numbers(tensor, 2, "i"))
    if any(n < 0 for n in shape):
        raise MalformedCheckpoint(f"constant {buffer} has a negative size in {list(shape)[:8]}")
    order = [int(d) for d in fb.numbers(tensor, 3, "B")]
    if order and sorted(order) != list(range(len(shape))):
        raise MalformedCheckpoint(f"constant {buffer} has dim_order {order[:8]} for {len(shape)} dims")
    stride = None
    if order and order != sorted(order):  # e.g. channels-last: strides follow dim_order, innermost last
        steps, acc = [0] * len(shape), 1
        for dim in reversed(order):
            steps[dim], acc = acc, acc * shape[dim]
        stride = tuple(steps)
    extra = fb.table(tensor, 9)
    name = fb.string(extra, 1, 1024) if extra is not None else None
    numel = 1
    for n in shape:
        numel *= n
    nbytes = dtypes.nbytes(dtype, numel) if dtype in dtypes.DTYPES else None
    start = end = None
    if nbytes is not None:
        if span[0] + nbytes > span[1]:
            raise MalformedCheckpoint(f"constant {buffer} ({dtype}{list(shape)[:8]}, {nbytes:,} bytes) runs past "
                                      f"its buffer ({span[1] - span[0]:,} bytes)")
        start, end = span[0], span[0] + nbytes
    return TensorInfo(name or f"constant[{buffer}]", dtype, shape, path, start, end, stride, f"buffer {buffer}")
