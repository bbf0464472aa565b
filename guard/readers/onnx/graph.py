"""ONNX models (``.onnx``): a protobuf walk of ModelProto for every weight it holds; ``onnx`` is not imported.

Weights live in five places, all read (``onnx.load(..., load_external_data=False)``
walking each of them is the reference):

- ``graph.initializer`` and ``graph.sparse_initializer``;
- ``Constant`` nodes (paddle2onnx writes every weight so, and older ``torch.onnx``
  exports many): attribute ``value`` (a TensorProto) or ``sparse_value`` with their
  own data type; ``value_float`` / ``value_floats`` are F32 and ``value_int`` /
  ``value_ints`` I64 by the operator's definition (``value_string(s)`` STRING), a
  0-d or 1-d tensor like any other: a float constant is computed in F32 whatever
  the rest of the graph is, so it counts as a weight like an F32 initializer;
- tensors held in an attribute of any other node, whatever its operator:
  ``t``, ``sparse_tensor``, ``tensors`` and ``sparse_tensors`` (ConstantOfShape's
  ``value``, the weights onnx's own "light" backend models keep so, a custom
  operator's tensors), named ``<node>/<attribute>`` (``[k]`` for a list), where
  ``<node>`` is the node's name, else ``<op_type>#<index>``;
- subgraphs held in node attributes of type GRAPH or GRAPHS (If's branches, Loop
  and Scan bodies), to any depth protobuf parses;
- the bodies of ``model.functions`` (FunctionProto nodes).

Each tensor has its name, dims and data type, inline (``raw_data`` skipped by its
length, or typed fields) or external (``data_location`` and ``external_data``: a
file beside the model, an offset and a length).  Graphs are walked from a work
list, never by recursion; nesting stops at protobuf's limit of 100 messages, as
``onnx.load`` does.  Names: an initializer keeps its own; a Constant is named by
its first output (else the node's name, else ``Constant#<index>``), inside a
subgraph or function after its path (``If_0/then_branch/``, ``Loop#3/body/``,
``functions/<domain>.<name>/``) with ``%`` and ``/`` of each part escaped as
``%25`` and ``%2F``; a name already taken gets ``#2``, ``#3``, ...  The graph's
inputs' and outputs' element types, the opsets, IR version and producer go into
the metadata.  Everything else is parsed only as far as protobuf would parse it,
so a file ``onnx.load`` refuses is CG001 here too; the inline checks are
``numpy_helper.to_array``'s.  Initializers of training graphs are not weights.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.readers.binary.protobuf import FIXED32, LEN, MAX_DEPTH, VARINT, Field, Wire
from guard.readers.binary.window import Window
from guard.readers.onnx.schema import DATA_TYPES, SCHEMA
from guard.readers.onnx.tensors import (
    ConstantValue,
    RawTensor,
    Spans,
    constant_info,
    external_data_findings,
    has_constant,
    read_name,
    read_sparse,
    read_tensor,
    read_text,
    tensor_info,
)
from guard.records import Record
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

__all__ = ["external_data_findings", "read_onnx"]

MAX_LISTED = 16  # graph inputs/outputs named in the metadata
MAX_TEXT = 200  # bytes of a producer name or an opset domain kept


@dataclass  # mutable: the walk appends tensors, names, inputs and outputs as it reads the graphs
class _Model:
    tensors: list[TensorInfo] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    suffixes: dict[str, int] = field(default_factory=dict)  # name -> the next #n to try (unique)
    unknown: dict[str, list[str]] = field(default_factory=dict)
    companions: dict[str, None] = field(default_factory=dict)
    inputs: list[tuple[str, str]] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


class _Body(Record):
    """A graph (or a function's nodes) waiting in the work list."""

    spans: Spans
    depth: int
    prefix: str = ""  # the path of a subgraph or function, escaped, ending in "/"
    top: bool = False
    function: bool = False


@dataclass  # mutable: the attribute walk sets name and reference, appends spans, fills value
class _Attribute:
    name: str = ""
    graph: Spans = field(default_factory=list)  # g: an optional message sent twice is merged
    graphs: list[Spans] = field(default_factory=list)  # graphs: numbered
    tensor: Spans = field(default_factory=list)  # t
    sparse: Spans = field(default_factory=list)  # sparse_tensor
    tensors: list[Spans] = field(default_factory=list)  # tensors: numbered, each its own message
    sparses: list[Spans] = field(default_factory=list)  # sparse_tensors
    reference: bool = False  # ref_attr_name: a function's attribute stands here, no value
    value: ConstantValue = field(default_factory=ConstantValue)


def escaped(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


class _Walk:
    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.win = Window(source)
        self.wire = Wire(self.win, SCHEMA)
        self.model = _Model()
        self.queue: deque[_Body] = deque()

    def text(self, f: Field, limit: int | None = None) -> str:
        return read_text(self.wire, f, limit)

    def run(self) -> _Model:
        graphs: Spans = []
        functions: list[Field] = []
        opsets: list[str] = []
        known = SCHEMA["ModelProto"]
        for f in self.wire.fields(0, self.source.size, 0):
            if f.number == 7 and f.wire == LEN:
                graphs.append((f.value, f.end))  # an optional message sent twice is merged
                continue
            if f.number == 25 and f.wire == LEN:
                functions.append(f)
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
        self.queue.append(_Body(graphs, 1, top=True))
        self.queue.extend(self.function(f) for f in functions)
        while self.queue:  # breadth first: a 10,000-deep nest is a long list, never a deep stack
            body = self.queue.popleft()
            self.body(body)
        return self.model

    def opset(self, f: Field) -> str:
        domain, version = "", 0
        for g in self.wire.fields(f.value, f.end, 1):
            if g.number == 1 and g.wire == LEN:
                domain = self.text(g, MAX_TEXT)
            elif g.number == 2 and g.wire == VARINT:
                version = g.value
        return f"{domain or 'ai.onnx'}:{version}"

    def function(self, f: Field) -> _Body:
        """A FunctionProto: its nodes are walked as a graph's, its other fields validated now."""
        known = SCHEMA["FunctionProto"]
        label = {1: "", 10: "", 13: ""}
        for g in self.wire.fields(f.value, f.end, 1):
            if g.number in label and g.wire == LEN:
                label[g.number] = self.text(g, MAX_TEXT)
            elif g.number != 7 or g.wire != LEN:
                self.wire.validate_field(known.get(g.number), g, 1)
        name = f"{label[10]}.{label[1]}" + (f"@{label[13]}" if label[13] else "")
        return _Body([(f.value, f.end)], 1, f"functions/{escaped(name)}/", function=True)

    def body(self, body: _Body) -> None:
        depth = body.depth
        if depth > MAX_DEPTH:  # If/Loop bodies nest graph > node > attribute > graph ...
            raise MalformedCheckpoint(f"protobuf messages nest more than {MAX_DEPTH} deep (subgraphs)")
        known = SCHEMA["FunctionProto" if body.function else "GraphProto"]
        node_field = 7 if body.function else 1
        names: set[str] = set()
        io: list[tuple[int, Field]] = []
        constants: list[tuple[TensorInfo, bool, RawTensor | None]] = []  # named at the graph's end, node order
        nodes = 0
        for start, end in body.spans:
            for f in self.wire.fields(start, end, depth):
                if f.wire != LEN:
                    self.wire.validate_field(known.get(f.number), f, depth)
                elif f.number == node_field:
                    for info, unknown, raw in self.node(f, depth + 1, nodes, body.prefix):
                        constants.append((info, unknown, raw if raw and raw.data_location == 1 else None))
                    nodes += 1
                elif body.function:
                    continue  # validated by function()
                elif f.number in (5, 15):
                    self.initializer(f, depth + 1, names, sparse=f.number == 15)
                elif f.number in (11, 12):
                    self.wire.validate("ValueInfoProto", f.value, f.end, depth + 1)
                    io.append((f.number, f))
                else:
                    self.wire.validate_field(known.get(f.number), f, depth)
        for info, unknown, raw in constants:  # after the graph's initializers, which keep their names
            self.add(info._replace(name=self.unique(info.name)), unknown, raw)
        if body.top:
            for number, f in io:
                name, elem = self.value_info(f, depth + 1)
                if number == 12 or name not in names:  # old exporters list initializers as inputs too
                    (self.model.inputs if number == 11 else self.model.outputs).append((name, elem))

    def unique(self, name: str) -> str:
        """``name``, else the first free ``name#2``, ``name#3``, ...; where to look next is kept per name,
        so 100,000 Constants of one name cost linear time, not quadratic."""
        if name not in self.model.names:
            return name
        n = self.model.suffixes.get(name, 2)
        while f"{name}#{n}" in self.model.names:
            n += 1
        self.model.suffixes[name] = n + 1
        return f"{name}#{n}"

    def add(self, info: TensorInfo, unknown: bool, raw: RawTensor | None = None) -> None:
        if unknown:
            self.model.unknown.setdefault(info.dtype, []).append(info.name)
        if raw is not None and raw.location is not None:
            self.model.companions[raw.location] = None
        self.model.names.add(info.name)
        self.model.tensors.append(info)

    def node(self, f: Field, depth: int, index: int,
             prefix: str) -> list[tuple[TensorInfo, bool, RawTensor | None]]:
        """Queue the node's subgraphs; the tensors it holds: a Constant's value, any other node's tensor
        attributes (each as ``constant_info`` gives it: the tensor, whether its dtype is unknown, its proto)."""
        known = SCHEMA["NodeProto"]
        text = {2: "", 3: "", 4: "", 7: ""}  # first output, name, op_type, domain
        outputs = 0
        attributes: list[_Attribute] = []
        for a in self.wire.fields(f.value, f.end, depth):
            if a.wire == LEN and a.number == 5:
                attributes.append(self.attribute(a, depth + 1))
            elif a.wire == LEN and a.number in text:
                if a.number != 2 or not outputs:
                    text[a.number] = read_name(self.wire, a)
                outputs += a.number == 2
            else:
                self.wire.validate_field(known.get(a.number), a, depth)
        output, name, op_type, domain = text[2], text[3], text[4], text[7]
        constant = op_type == "Constant" and domain in ("", "ai.onnx")
        label = escaped(name or f"{op_type}#{index}")
        value = None
        held: list[tuple[TensorInfo, bool, RawTensor | None]] = []
        for attr in attributes:
            part = escaped(attr.name)
            subgraphs = [(part, attr.graph)] if attr.graph else []
            subgraphs += [(f"{part}[{k}]", spans) for k, spans in enumerate(attr.graphs)]
            for where, spans in subgraphs:
                self.queue.append(_Body(spans, depth + 2, f"{prefix}{label}/{where}/"))
            if constant and value is None and not attr.reference:
                attr.value.kind = attr.name
                if attr.name == "value" and attr.tensor:
                    attr.value.tensor, attr.tensor = read_tensor(self.wire, attr.tensor, depth + 2), []
                elif attr.name == "sparse_value" and attr.sparse:
                    attr.value.tensor, attr.value.dims = read_sparse(self.wire, attr.sparse, depth + 2,
                                                                     self.source.name)
                    attr.sparse = []
                value = attr.value if has_constant(attr.value) else None
            elif not constant and not attr.reference:
                held.extend(self.attribute_tensors(attr, f"{prefix}{label}/{part}", depth + 2))
            for start, end in [*attr.tensor, *(span for spans in attr.tensors for span in spans)]:
                self.wire.validate("TensorProto", start, end, depth + 2)
            for start, end in [*attr.sparse, *(span for spans in attr.sparses for span in spans)]:
                self.wire.validate("SparseTensorProto", start, end, depth + 2)
        if value is not None:
            base = output or name or f"Constant#{index}"
            held.append(constant_info(value, f"{prefix}{escaped(base)}" if prefix else base, self.source.name))
        return held

    def attribute_tensors(self, attr: _Attribute, where: str,
                          depth: int) -> list[tuple[TensorInfo, bool, RawTensor | None]]:
        """The tensors in one attribute of a node that is not a Constant, named ``where`` (``[k]`` for a list)."""
        found: list[tuple[str, RawTensor, tuple[int, ...] | None]] = []
        if attr.tensor:
            found.append((where, read_tensor(self.wire, attr.tensor, depth), None))
        if attr.sparse:
            found.append((where, *read_sparse(self.wire, attr.sparse, depth, self.source.name)))
        found += [(f"{where}[{k}]", read_tensor(self.wire, spans, depth), None) for k, spans in enumerate(attr.tensors)]
        found += [(f"{where}[{k}]", *read_sparse(self.wire, spans, depth, self.source.name))
                  for k, spans in enumerate(attr.sparses)]
        attr.tensor, attr.sparse, attr.tensors, attr.sparses = [], [], [], []  # read: nothing left to validate
        out: list[tuple[TensorInfo, bool, RawTensor | None]] = []
        for name, raw, dims in found:
            raw.name = name
            info, unknown = tensor_info(raw, self.source.name, dims=dims, what="attribute tensor")
            out.append((info, unknown, raw))
        return out

    def attribute(self, f: Field, depth: int) -> _Attribute:
        """The attribute's name, subgraphs and tensors (spans, for node to walk), and scalar values."""
        known = SCHEMA["AttributeProto"]
        out = _Attribute()
        value = out.value
        for a in self.wire.fields(f.value, f.end, depth):
            if a.wire == LEN and a.number in (1, 5, 6, 10, 11, 22, 23):
                if a.number == 1:
                    out.name = read_name(self.wire, a)
                elif a.number in (10, 11, 23):
                    {10: out.tensors, 11: out.graphs, 23: out.sparses}[a.number].append([(a.value, a.end)])
                else:
                    {5: out.tensor, 6: out.graph, 22: out.sparse}[a.number].append((a.value, a.end))
            elif a.number in (7, 8, 9):
                kind = known[a.number]
                if a.wire == LEN and kind != "bytes*":
                    count = self.wire.packed_count(kind.rstrip("*"), a.value, a.end)
                else:
                    count = int(self.wire.number_kind(kind, a) or (kind == "bytes*" and a.wire == LEN))
                value.counts[a.number] = value.counts.get(a.number, 0) + count
            else:
                self.wire.validate_field(known.get(a.number), a, depth)
                if a.number == 21 and a.wire == LEN:
                    out.reference = True
                elif a.number in (2, 3, 4) and a.wire == (FIXED32, VARINT, LEN)[a.number - 2]:
                    value.present.add(a.number)
        return out

    def initializer(self, f: Field, depth: int, names: set[str], *, sparse: bool) -> None:
        if sparse:
            raw, dims = read_sparse(self.wire, [(f.value, f.end)], depth, self.source.name)
        else:
            raw, dims = read_tensor(self.wire, [(f.value, f.end)], depth), None
        if raw.name in names:
            raise MalformedCheckpoint(f"initializer {shown(raw.name)} is defined twice in one graph")
        names.add(raw.name)
        self.add(*tensor_info(raw, self.source.name, dims=dims), raw)

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
                     f"{len(names):,} tensor(s), e.g. {shown(names[0])}", tensor=names[0])
        for code, names in model.unknown.items()
    ]
    return FileScan(path=source.name, format="onnx", size=source.size, tensors=tuple(model.tensors),
                    findings=tuple(findings), metadata=metadata, bytes_read=walk.win.bytes_read,
                    companions=tuple(model.companions))
