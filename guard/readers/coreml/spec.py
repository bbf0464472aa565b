"""Core ML model specs (``.mlmodel``, ``Model.proto``): neural-network ``WeightParams``, walked in place.

A neural network (``neuralNetwork``, ``neuralNetworkClassifier``/``Regressor``, inside
pipelines too) keeps its weights in the spec: each layer's ``WeightParams`` holds
``floatValue`` (packed fp32), ``float16Value`` (fp16 bytes), or for quantized weights
``rawValue`` with ``quantization`` (n-bit integers) or ``int8RawValue``.  The walker
follows only the fields on a path to a ``WeightParams`` (``coreml_schema``) and skips
the rest by its length, so a spec of 1 GB of weights costs a few reads of its headers.
A weight is named ``<layer name>.<field>`` (``linear_0.weights``); the spec gives no
shape beside the element count.  An ML program spec (weights in the package's blob
files) read alone holds none of its weights: CG006.
"""

from __future__ import annotations

from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.readers.binary.protobuf import FIXED32, LEN, MAX_DEPTH, VARINT, Field, Wire
from guard.readers.binary.window import Window
from guard.readers.coreml.schema import WEIGHT_PATHS
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

ML_PROGRAM = 502  # Model.mlProgram
MAX_NAME = 4096
QUANTIZED_BITS = {8: "U8", 4: "U4", 2: "U2"}  # QuantizationParams.numberOfBits -> the payload's code
# coremltools' defaults store fp16 (an ML program; quantize_weights(nbits=16) for a network): CG101 says so
HINT_F16 = ("coremltools.convert(..., convert_to=\"mlprogram\") stores fp16 weights by default "
            "(compute_precision=ct.precision.FLOAT16); pass compute_precision=ct.precision.FLOAT32 for fp32 weights, "
            "or, if fp16 is what you want, scan with --expect fp16 (expect = \"fp16\")")


class _Spec:
    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.win = Window(source)
        self.wire = Wire(self.win, {})
        self.tensors: list[TensorInfo] = []
        self.quantized = False
        self.program = False

    def message(self, kind: str, start: int, end: int, path: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise MalformedCheckpoint(f"protobuf messages nest more than {MAX_DEPTH} deep")
        paths = WEIGHT_PATHS.get(kind, {})
        if kind == "NeuralNetworkLayer":
            path = self.layer_name(start, end, depth) or path
        for f in self.wire.fields(start, end, depth):
            if depth == 0 and f.number == ML_PROGRAM and f.wire == LEN:
                self.program = True
            target = paths.get(f.number)
            if target is None or f.wire != LEN:
                continue
            name, sub = target
            if sub == "WeightParams":  # a layer's weight is named by its layer and field: linear_0.weights
                self.weight(f, f"{path}.{name}" if path else name, depth + 1)
            else:  # containers (networks, pipelines, a layer's params) add nothing to the name
                self.message(sub, f.value, f.end, path, depth + 1)

    def layer_name(self, start: int, end: int, depth: int) -> str:
        for f in self.wire.fields(start, end, depth):
            if f.number == 1 and f.wire == LEN:
                return self.win.read(f.value, min(f.end - f.value, MAX_NAME)).decode("utf-8", "backslashreplace")
        return ""

    def weight(self, f: Field, name: str, depth: int) -> None:
        floats = halves = raw = int8 = 0
        bits: int | None = None
        for g in self.wire.fields(f.value, f.end, depth):
            if g.number == 1 and g.wire == LEN:
                if (g.end - g.value) % 4:
                    raise MalformedCheckpoint(f"weights {name!r}: packed floats of {g.end - g.value:,} bytes")
                floats += (g.end - g.value) // 4
            elif g.number == 1 and g.wire == FIXED32:
                floats += 1
            elif g.number == 2 and g.wire == LEN:
                halves += g.end - g.value
            elif g.number == 30 and g.wire == LEN:
                raw += g.end - g.value
            elif g.number == 31 and g.wire == LEN:
                int8 += g.end - g.value
            elif g.number == 40 and g.wire == LEN:
                bits = self.quantization_bits(g, depth + 1)
        if halves % 2:
            raise MalformedCheckpoint(f"weights {name!r}: float16Value of {halves:,} bytes (not whole fp16 values)")
        kinds = [(code, n) for code, n in (("F32", floats), ("F16", halves // 2), ("I8", int8)) if n]
        if raw:
            code = QUANTIZED_BITS.get(bits or 0, f"coreml:raw{bits or ''}")
            kinds.append((code, raw * 8 // (bits or 8)))
        if len(kinds) > 1:
            raise MalformedCheckpoint(f"weights {name!r} hold values of more than one kind")
        if kinds:
            self.quantized |= bool(int8 or bits)
            self.tensors.append(TensorInfo(name, kinds[0][0], (kinds[0][1],), self.source.name))

    def quantization_bits(self, f: Field, depth: int) -> int:
        for g in self.wire.fields(f.value, f.end, depth):
            if g.number == 1 and g.wire == VARINT:
                return g.value
        return 8


def read_mlmodel(source: ByteSource) -> FileScan:
    spec = _Spec(source)
    spec.message("Model", 0, source.size, "", 0)
    if spec.program and not spec.tensors:
        finding = make_finding("CG006", source.name, "Core ML ML program spec without its package: its weights are "
                               "in the .mlpackage's weights/weight.bin, so the file alone was not scanned")
        return FileScan(path=source.name, format=None, size=source.size, findings=(finding,),
                        metadata={"unsupported": "Core ML"}, bytes_read=spec.win.bytes_read)
    metadata = {"quantization": "coreml"} if spec.quantized else {}
    if any(t.dtype == "F16" for t in spec.tensors):
        metadata.update({"compressed": "F16", "compressed.hint": HINT_F16})
    return FileScan(path=source.name, format="coreml", size=source.size, tensors=tuple(spec.tensors),
                    metadata=metadata, bytes_read=spec.win.bytes_read)
