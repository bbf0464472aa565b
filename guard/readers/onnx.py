"""ONNX models (``.onnx``): a protobuf walk of ModelProto for its initializers; ``onnx`` is not imported.

What is read: the graph's initializers and sparse initializers, and those of every
subgraph held in a node attribute (If's branches, Loop and Scan bodies), each
with its name, dims and data type, inline (``raw_data`` skipped by its length, or
typed fields) or external (``data_location`` and ``external_data``: a file beside
the model, an offset and a length).  The graph's inputs' and outputs' element
types, the opsets, IR version and producer go into the metadata.  Everything else
is parsed only as far as protobuf would parse it, so a file ``onnx.load`` refuses
is CG001 here too; the inline checks are ``numpy_helper.to_array``'s.
Initializers of training graphs and tensors held by Constant nodes are not
weights in this sense and are not listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.readers.onnx_schema import DATA_TYPES, SCHEMA
from guard.readers.onnx_tensors import MAX_RANK, RawTensor, external_data_findings, tensor_info
from guard.readers.protobuf import LEN, MAX_DEPTH, VARINT, Field, Wire
from guard.readers.window import Window
from guard.sources import ByteSource

MAX_NAME = 2**20  # bytes of a tensor name: a claimed 1 GB name is never read into memory
from guard.tensors import FileScan, TensorInfo

__all__ = ["external_data_findings", "read_onnx"]

MAX_LISTED = 16  # graph inputs/outputs named in the metadata
MAX_TEXT = 200  # bytes of a producer name or an opset domain kept


@dataclass
class _Model:
    tensors: list[TensorInfo] = field(default_factory=list)
    unknown: dict[str, list[str]] = field(default_factory=dict)
    companions: dict[str, None] = field(default_factory=dict)
    inputs: list[tuple[str, str]] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


class _Walk:
    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.win = Window(source)
        self.wire = Wire(self.win, SCHEMA)
        self.model = _Model()

    def text(self, f: Field, limit: int | None = None) -> str:
        end = f.end if limit is None else min(f.end, f.value + limit)
        return self.win.read(f.value, end - f.value).decode("utf-8", "backslashreplace")

    def run(self) -> _Model:
        graphs: list[tuple[int, int]] = []
        opsets: list[str] = []
        known = SCHEMA["ModelProto"]
        for f in self.wire.fields(0, self.source.size, 0):
            if f.number == 7 and f.wire == LEN:
                graphs.append((f.value, f.end))  # an optional message sent twice is merged
                continue
            self.wire.validate_field(known.get(f.number), f, 0)
            if f.number == 8 and f.wire == LEN:
                opsets.append(self.opset(f))
            elif f.number == 1 and f.wire == VARINT:
                self.model.metadata["onnx.ir_version"] = str(f.value)
            elif f.number in (2, 3) and f.wire == LEN:
                key = "onnx.producer" if f.number == 2 else "onnx.producer_version"
                self.model.metadata[key] = self.text(f, MAX_TEXT)
        if opsets:
            self.model.metadata["onnx.opset"] = ",".join(opsets[:MAX_LISTED])
        if not graphs:  # protobuf parses an empty file as an empty model; nothing can run it
            raise MalformedCheckpoint("ONNX model has no graph (an empty or cut file?)")
        self.graph(graphs, 1, top=True)
        return self.model

    def opset(self, f: Field) -> str:
        domain, version = "", 0
        for g in self.wire.fields(f.value, f.end, 1):
            if g.number == 1 and g.wire == LEN:
                domain = self.text(g, MAX_TEXT)
            elif g.number == 2 and g.wire == VARINT:
                version = g.value
        return f"{domain or 'ai.onnx'}:{version}"

    def graph(self, spans: list[tuple[int, int]], depth: int, *, top: bool = False) -> None:
        if depth > MAX_DEPTH:  # If/Loop bodies nest graph > node > attribute > graph ...
            raise MalformedCheckpoint(f"protobuf messages nest more than {MAX_DEPTH} deep (subgraphs)")
        known = SCHEMA["GraphProto"]
        names: set[str] = set()
        io: list[tuple[int, Field]] = []
        for start, end in spans:
            for f in self.wire.fields(start, end, depth):
                if f.wire != LEN or f.number not in (1, 5, 15, 11, 12):
                    self.wire.validate_field(known.get(f.number), f, depth)
                elif f.number == 1:
                    self.node(f, depth + 1)
                elif f.number in (5, 15):
                    self.initializer(f, depth + 1, names, sparse=f.number == 15)
                else:
                    self.wire.validate("ValueInfoProto", f.value, f.end, depth + 1)
                    io.append((f.number, f))
        if top:
            for number, f in io:
                name, elem = self.value_info(f, depth + 1)
                if number == 12 or name not in names:  # old exporters list initializers as inputs too
                    (self.model.inputs if number == 11 else self.model.outputs).append((name, elem))

    def node(self, f: Field, depth: int) -> None:
        known = SCHEMA["NodeProto"]
        for a in self.wire.fields(f.value, f.end, depth):
            if a.number == 5 and a.wire == LEN:
                self.attribute(a, depth + 1)
            else:
                self.wire.validate_field(known.get(a.number), a, depth)

    def attribute(self, f: Field, depth: int) -> None:
        known = SCHEMA["AttributeProto"]
        merged: list[tuple[int, int]] = []
        for a in self.wire.fields(f.value, f.end, depth):
            if a.number == 6 and a.wire == LEN:
                merged.append((a.value, a.end))
            elif a.number == 11 and a.wire == LEN:
                self.graph([(a.value, a.end)], depth + 1)
            else:
                self.wire.validate_field(known.get(a.number), a, depth)
        if merged:
            self.graph(merged, depth + 1)

    def initializer(self, f: Field, depth: int, names: set[str], *, sparse: bool) -> None:
        if sparse:
            raw, dims = self.sparse(f, depth)
        else:
            raw = self.tensor([(f.value, f.end)], depth)
            dims = None
        info, unknown = tensor_info(raw, self.source.name, dims=dims)
        if info.name in names:
            raise MalformedCheckpoint(f"initializer {shown(info.name)} is defined twice in one graph")
        names.add(info.name)
        if unknown:
            self.model.unknown.setdefault(info.dtype, []).append(info.name)
        if raw.location is not None:
            self.model.companions[raw.location] = None
        self.model.tensors.append(info)

    def sparse(self, f: Field, depth: int) -> tuple[RawTensor, tuple[int, ...]]:
        values: list[tuple[int, int]] = []
        indices: list[tuple[int, int]] = []
        dims: list[int] = []
        for g in self.wire.fields(f.value, f.end, depth):
            if g.number in (1, 2) and g.wire == LEN:
                (values if g.number == 1 else indices).append((g.value, g.end))
            elif g.number == 3:
                dims.extend(self.dims(g, len(dims)))
        if not values:
            raise MalformedCheckpoint("sparse initializer without values")
        if indices:
            tensor_info(self.tensor(indices, depth + 1), self.source.name)  # checked, not listed
        return self.tensor(values, depth + 1), tuple(dims)

    def dims(self, f: Field, have: int) -> list[int]:
        """Signed int64 values of a repeated varint field, packed or not; no more than one past MAX_RANK
        in all, which the shape check refuses (a packed field of 100 MB would be 100 M Python ints)."""
        if f.wire == VARINT:
            values = [f.value]
        elif f.wire == LEN:
            values, pos = [], f.value
            while pos < f.end and have + len(values) <= MAX_RANK:
                value, pos = self.wire.varint(pos, f.end)
                values.append(value)
        else:
            return []
        return [v - (1 << 64) if v >= 1 << 63 else v for v in values]

    def tensor(self, spans: list[tuple[int, int]], depth: int) -> RawTensor:
        if depth > MAX_DEPTH:
            raise MalformedCheckpoint(f"protobuf messages nest more than {MAX_DEPTH} deep")
        t = RawTensor()
        known = SCHEMA["TensorProto"]
        for start, end in spans:
            for f in self.wire.fields(start, end, depth):
                kind = known.get(f.number)
                if f.number == 1:
                    t.dims.extend(self.dims(f, len(t.dims)))
                elif f.number == 2 and f.wire == VARINT:
                    value = f.value & 0xFFFFFFFF
                    t.data_type = value - (1 << 32) if value >= 1 << 31 else value
                elif f.number == 3 and f.wire == LEN:
                    self.wire.validate("TensorProto.Segment", f.value, f.end, depth + 1)
                    t.segment = True
                elif f.number in (4, 5, 7, 10, 11) and kind is not None:
                    if f.wire == LEN:
                        t.counts[f.number] = t.counts.get(f.number, 0) + self.wire.packed_count(
                            kind.rstrip("*"), f.value, f.end)
                    elif self.wire.number_kind(kind, f):
                        t.counts[f.number] = t.counts.get(f.number, 0) + 1
                elif f.number == 6 and f.wire == LEN:
                    t.counts[6] = t.counts.get(6, 0) + 1
                elif f.number == 8 and f.wire == LEN:
                    if f.end - f.value > MAX_NAME:
                        raise MalformedCheckpoint(f"a tensor name of {f.end - f.value:,} bytes (over {MAX_NAME:,})")
                    t.name = self.text(f)
                elif f.number == 9 and f.wire == LEN:
                    t.raw = (f.value, f.end)
                elif f.number == 13 and f.wire == LEN:
                    t.external.append(self.entry(f, depth + 1))
                elif f.number == 14 and f.wire == VARINT:
                    if f.value in (0, 1):  # a closed proto2 enum: other values are kept as unknown
                        t.data_location = f.value
                else:
                    self.wire.validate_field(kind, f, depth)
        return t

    def entry(self, f: Field, depth: int) -> tuple[str, str]:
        key = value = ""
        for g in self.wire.fields(f.value, f.end, depth):
            if g.number in (1, 2) and g.wire == LEN:
                text = self.text(g, 4096)
                key, value = (text, value) if g.number == 1 else (key, text)
        return key, value

    def value_info(self, f: Field, depth: int) -> tuple[str, str]:
        name, elem = "", "?"
        for g in self.wire.fields(f.value, f.end, depth):
            if g.number == 1 and g.wire == LEN:
                name = self.text(g, MAX_TEXT)
            elif g.number == 2 and g.wire == LEN:
                elem = self.elem_type(g, depth + 1)
        return name, elem

    def elem_type(self, f: Field, depth: int) -> str:
        for g in self.wire.fields(f.value, f.end, depth):
            if g.number in (1, 8) and g.wire == LEN:  # tensor_type, sparse_tensor_type
                for h in self.wire.fields(g.value, g.end, depth + 1):
                    if h.number == 1 and h.wire == VARINT:
                        return DATA_TYPES.get(h.value, f"onnx:{h.value}")
            elif g.wire == LEN and g.number in (4, 5, 9):
                return "sequence" if g.number == 4 else "map" if g.number == 5 else "optional"
        return "?"


def read_onnx(source: ByteSource) -> FileScan:
    walk = _Walk(source)
    model = walk.run()
    metadata = model.metadata
    for key, listed in (("inputs", model.inputs), ("outputs", model.outputs)):
        if listed:
            metadata[f"onnx.{key}"] = ", ".join(f"{n[:64]}:{e}" for n, e in listed[:MAX_LISTED]) + (
                ", …" if len(listed) > MAX_LISTED else "")
            metadata[f"onnx.{key[:-1]}_dtypes"] = ",".join(sorted({e for _n, e in listed}))
    findings: list[Finding] = [
        make_finding("CG005", source.name, f"unknown ONNX data type {code.split(':')[1]} on "
                     f"{len(names):,} initializer(s), e.g. {shown(names[0])}", tensor=names[0])
        for code, names in model.unknown.items()
    ]
    return FileScan(path=source.name, format="onnx", size=source.size, tensors=tuple(model.tensors),
                    findings=tuple(findings), metadata=metadata, bytes_read=walk.win.bytes_read,
                    companions=tuple(model.companions))
