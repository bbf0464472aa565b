"""TensorFlow Lite flatbuffers (``.tflite``, file identifier ``TFL3``): constant tensors, their types and quantization.

tensorflow/lite/schema/schema.fbs: ``Model`` (version 0, subgraphs 2, buffers 4)
-> ``SubGraph.tensors`` (0) -> ``Tensor`` (shape 0, type 1, buffer 2, name 3,
quantization 4).  ``Model.buffers[i]`` is ``Buffer`` (data 0, offset 1, size 2):
inline data, or for files over 2 GB an offset/size past the flatbuffer.  A
tensor whose buffer holds bytes is a weight; buffer 0 is the empty sentinel and
activations point at empty buffers.  A weight of int8/uint8/int16/int4 with
quantization scales is quantized: ``metadata["quantization"]`` says so, and the
inventory reports the set as quantized.  The flatbuffer walk is bounded
(``guard.readers.binary.flatbuffers``): offsets past the end, misaligned or looping
tables are CG001.
"""

from __future__ import annotations

from math import prod

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.readers.binary.flatbuffers import FlatBuffer
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

IDENTIFIER = b"TFL3"
MAX_NAME = 4096
SCHEMA_VERSION = 3
MAX_RANK = 64
# tensorflow/lite/schema/schema.fbs TensorType -> dtype code (RESOURCE 13, VARIANT 14 are handles, not data)
TENSOR_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "I32", 3: "U8", 4: "I64", 5: "STRING", 6: "BOOL", 7: "I16", 8: "C64", 9: "I8",
    10: "F64", 11: "C128", 12: "U64", 15: "U32", 16: "U16", 17: "I4", 18: "BF16", 19: "I2",
}
_QUANTIZABLE = frozenset({"I8", "U8", "I16", "I4", "I2", "I32"})


def is_tflite(head: bytes) -> bool:
    return len(head) >= 8 and head[4:8] == IDENTIFIER


def read_tflite(source: ByteSource) -> FileScan:
    if source.size < 8:
        raise MalformedCheckpoint(f"TFLite file of {source.size} bytes is too short for a flatbuffer")
    fb = FlatBuffer(source)
    if fb.identifier() != IDENTIFIER:
        raise MalformedCheckpoint("no TFL3 file identifier at bytes 4-8: not a TFLite flatbuffer")
    model = fb.root()
    version = int(fb.scalar(model, 0, "I", 0))
    if version != SCHEMA_VERSION:  # the interpreter refuses any other (TFLITE_SCHEMA_VERSION)
        raise MalformedCheckpoint(f"TFLite schema version {version}, not {SCHEMA_VERSION}")
    buffers = list(fb.tables(model, 4))
    spans: dict[int, tuple[int, int] | None] = {}

    def buffer_span(index: int) -> tuple[int, int] | None:
        if index not in spans:
            spans[index] = _buffer(fb, buffers[index], source.size)
        return spans[index]

    tensors: list[TensorInfo] = []
    unknown: dict[str, list[str]] = {}
    quantized: set[str] = set()
    for g, subgraph in enumerate(fb.tables(model, 2)):
        _check_subgraph(fb, subgraph)
        for t, tensor in enumerate(fb.tables(subgraph, 0)):
            # every tensor is parsed whole, as the interpreter's verifier does: a cut file fails here
            index = int(fb.scalar(tensor, 2, "I", 0))
            name = fb.string(tensor, 3, MAX_NAME) or f"subgraph{g}/tensor{t}"
            shape = tuple(int(d) for d in fb.numbers(tensor, 0, "i"))
            kind = int(fb.scalar(tensor, 1, "b", 0))
            scaled = _has_scales(fb, tensor, shape, t)
            fb.vector(tensor, 7, 4)  # shape_signature
            fb.scalar(tensor, 5, "B", 0), fb.scalar(tensor, 8, "B", 0), fb.table(tensor, 6)  # as the Verifier reads
            for _ in fb.tables(tensor, 9):  # variant_tensors
                pass
            _check_bytes_required(shape, kind, t)
            if index >= len(buffers):
                raise MalformedCheckpoint(f"tensor {t} of subgraph {g} names buffer {index:,} of {len(buffers):,}")
            span = buffer_span(index) if index else None
            if span is None:
                if not 0 <= kind <= max(TENSOR_TYPES):  # the interpreter cannot build a tensor of no known type
                    raise MalformedCheckpoint(f"tensor {t} of subgraph {g} has unknown TFLite type {kind}")
                continue  # an activation, an input or a variable: no constant data
            if g:
                name = f"subgraph{g}/{name}"
            code = TENSOR_TYPES.get(kind)
            if code is None:
                code = f"tflite:{kind}"
                unknown.setdefault(code, []).append(name)
            if len(shape) > MAX_RANK or any(d < 0 for d in shape):
                raise MalformedCheckpoint(f"constant tensor {shown(name)} has shape {list(shape)[:8]}")
            want = dtypes.nbytes(code, prod(shape)) if code not in ("I4", "I2") else None  # int4 may be unpacked
            if want is not None and fb.table(tensor, 6) is None and span[1] - span[0] < want:
                raise MalformedCheckpoint(f"constant tensor {shown(name)} needs {want:,} bytes, its buffer holds "
                                          f"{span[1] - span[0]:,}")
            if code in _QUANTIZABLE and scaled:
                quantized.add(code)
            if code == "STRING":
                continue  # string constants (lookup tables, labels) are not weights
            tensors.append(TensorInfo(name, code, shape, source.name, span[0], span[1]))
    for i in range(len(buffers)):
        buffer_span(i)  # every buffer, used or not, must lie in the file
    _check_model(fb, model)
    findings: list[Finding] = [
        make_finding("CG005", source.name, f"{len(names):,} constant tensor(s) of TFLite type {code.split(':')[1]}, "
                     "which has no dtype code here", tensor=names[0])
        for code, names in sorted(unknown.items())]
    metadata = {"tflite.version": str(version), "tflite.buffers": str(len(buffers))}
    if quantized:
        metadata["quantization"] = "tflite " + "+".join(sorted(c.lower() for c in quantized))
    return FileScan(path=source.name, format="tflite", size=source.size, tensors=tuple(tensors),
                    findings=tuple(findings), metadata=metadata, bytes_read=getattr(source, "bytes_read", 0))


def _buffer(fb: FlatBuffer, buffer: int, file_size: int) -> tuple[int, int] | None:
    """The bytes a buffer holds as an absolute span, None when empty."""
    data = fb.vector(buffer, 0, 1)
    fb.scalar(buffer, 1, "Q", 0), fb.scalar(buffer, 2, "Q", 0)
    if data is not None and data[1]:
        return data[0], data[0] + data[1]
    offset = int(fb.scalar(buffer, 1, "Q", 0))
    size = int(fb.scalar(buffer, 2, "Q", 0))
    if offset <= 1 or not size:  # offset 1 is the converter's placeholder before it appends the data
        return None
    if offset + size > file_size:
        raise MalformedCheckpoint(f"buffer data at offset {offset:,} ({size:,} bytes) runs past the end of the "
                                  f"file ({file_size:,} bytes): truncated?")
    return offset, offset + size


def _has_scales(fb: FlatBuffer, tensor: int, shape: tuple[int, ...], number: int) -> bool:
    """Whether the tensor has quantization scales; their counts checked as the interpreter checks them."""
    quantization = fb.table(tensor, 4)
    if quantization is None:
        return False
    for field in (0, 1):  # min, max
        fb.vector(quantization, field, 4)
    found = fb.vector(quantization, 2, 4)
    zero_points = fb.vector(quantization, 3, 8)
    scales = found[1] if found else 0
    if scales and zero_points and zero_points[1] != scales:
        raise MalformedCheckpoint(f"tensor {number} has {zero_points[1]:,} zero points for {scales:,} scales")
    axis = int(fb.scalar(quantization, 6, "i", 0))
    fb.scalar(quantization, 4, "B", 0), fb.table(quantization, 5)  # details (a union)
    if scales > 1 and not (0 <= axis < len(shape) and shape[axis] == scales):
        raise MalformedCheckpoint(f"tensor {number} has {scales:,} scales, not one per channel of axis {axis}")
    return scales > 0


def _check_bytes_required(shape: tuple[int, ...], kind: int, number: int) -> None:
    """The interpreter sizes every tensor in size_t (a negative dim wraps) and refuses an overflow."""
    count = 1
    for dim in shape:
        count *= dim % 2**64
        if count >= 2**64:
            raise MalformedCheckpoint(f"tensor {number} has shape {list(shape)[:8]}: its size overflows")
    info = dtypes.ALL_DTYPES.get(TENSOR_TYPES.get(kind, ""))
    if info is not None and info.bits and count * max(info.bits // 8, 1) >= 2**64:
        raise MalformedCheckpoint(f"tensor {number} has shape {list(shape)[:8]}: its size overflows")


def _check_subgraph(fb: FlatBuffer, subgraph: int) -> None:
    """Bounds of what a constant tensor does not need: the operators, inputs, outputs and name."""
    if fb.vector(subgraph, 0, 4) is None:
        raise MalformedCheckpoint("a subgraph has no tensors vector (the interpreter refuses it)")
    fb.vector(subgraph, 1, 4)
    fb.vector(subgraph, 2, 4)
    fb.string(subgraph, 4, MAX_NAME)
    for operator in fb.tables(subgraph, 3):
        fb.vector(operator, 1, 4)
        fb.vector(operator, 2, 4)
        fb.table(operator, 4)  # builtin_options: a union's table
        fb.vector(operator, 5, 1)  # custom_options
        fb.vector(operator, 7, 4)  # intermediates


def _check_model(fb: FlatBuffer, model: int) -> None:
    for code in fb.tables(model, 1):  # operator codes: deprecated code, custom code, version, builtin code
        fb.scalar(code, 0, "b", 0), fb.string(code, 1, MAX_NAME), fb.scalar(code, 2, "i", 0), fb.scalar(code, 3, "i", 0)
    fb.string(model, 3, MAX_NAME)  # description
    fb.vector(model, 5, 4)  # metadata_buffer
    for metadata in fb.tables(model, 6):
        fb.string(metadata, 0, MAX_NAME)
    for signature in fb.tables(model, 7):
        for field in (0, 1):  # inputs, outputs: TensorMap tables with a name
            for tensor_map in fb.tables(signature, field):
                fb.string(tensor_map, 0, MAX_NAME)
        fb.string(signature, 2, MAX_NAME)
