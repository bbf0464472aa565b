"""OpenVINO IR (``.xml`` + ``.bin`` of the same stem): the constants, from the ``.xml`` alone.

Each ``<layer type="Const">`` (``Constant`` in some writers) carries ``<data
element_type shape offset size>``: ``offset``/``size`` are bytes in the ``.bin``,
which holds nothing else.  Tensors are placed in the ``.bin`` (``TensorInfo.file``)
and the ``.bin`` is the scan's companion: the inventory checks it is there and long
enough (CG004), as for ONNX external data.  Bodies of TensorIterator/Loop/If
(``<body>``, ``<then_body>``, ...) are graphs of their own, scanned to any depth.

``openvino.save_model`` compresses f32 weights to f16 by default
(``compress_to_fp16=True``): an f16 Const feeding a ``Convert`` marked
``decompression`` in its ``rt_info``.  The stored dtype (F16) is what the scan
reports; the metadata says how many were compressed, and CG101 names the cause.
An integer Const (u8/i8/u4/i4/nf4) feeding a Convert to a float is NNCF weight
compression: the set is quantized.

The XML is hostile: expat with a DOCTYPE refused outright (no entity is ever
declared, so none is expanded or fetched: billion laughs and external entities
are CG001), a bounded size, element depth and number of constants.
"""

from __future__ import annotations

import posixpath
import xml.parsers.expat
from collections.abc import Callable
from math import prod

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import shown
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

MAX_XML_BYTES = 256 * 2**20  # the IR of a 70B LLM is a few MB; the weights are in the .bin
MAX_DEPTH = 128  # net > layers > layer > body > layers > ... ; real IRs nest under 20
MAX_CONSTS = 1_000_000
MAX_LAYERS = 4_000_000
MAX_RANK = 64
FIRST_CHUNK = 1 * 2**20  # a header up to 1 MiB costs one ranged read
CHUNK = 8 * 2**20
IR_VERSIONS = ("10", "11")
CONST_TYPES = ("Const", "Constant")
LAYER_ATTRIBUTES = ("id", "name", "type", "version")
PORT_ATTRIBUTES = ("id",)
EDGE_ATTRIBUTES = ("from-layer", "from-port", "to-layer", "to-port")
GRAPH_TAGS = ("net", "body", "then_body", "else_body")  # each opens a scope of layer ids
HINT_F16 = ("openvino.save_model compresses weights to f16 by default (compress_to_fp16=True) and "
            "decompresses them to f32 on load; save with compress_to_fp16=False for fp32 weights, or, if f16 is "
            "what you want, scan with --expect fp16 (expect = \"fp16\")")

# OpenVINO element types (ov::element::Type_t names as the IR spells them) -> dtype codes
ELEMENT_TYPES: dict[str, str] = {
    "f32": "F32", "f16": "F16", "bf16": "BF16", "f64": "F64",
    "f8e4m3": "F8_E4M3", "f8e5m2": "F8_E5M2", "f8e8m0": "F8_E8M0", "f4e2m1": "F4", "nf4": "NF4",
    "i4": "I4", "u4": "U4", "u2": "U2", "i8": "I8", "u8": "U8", "i16": "I16", "u16": "U16",
    "i32": "I32", "u32": "U32", "i64": "I64", "u64": "U64", "boolean": "BOOL", "string": "STRING",
}
QUANTIZED_WEIGHTS = frozenset({"U8", "I8", "U4", "I4", "NF4", "U2"})


class _Const:
    __slots__ = ("scope", "id", "layer_name", "port_name", "attrs", "depth")

    def __init__(self, scope: int, layer_id: str, name: str, depth: int) -> None:
        self.scope, self.id, self.layer_name, self.depth = scope, layer_id, name, depth
        self.port_name: str | None = None
        self.attrs: dict[str, str] | None = None


class _IR:
    """expat handlers: the Consts, the Converts and the edges that leave a Const."""

    def __init__(self) -> None:
        self.depth = 0
        self.parents: list[str] = []  # the open elements' tags
        self.root: str | None = None
        self.version = ""
        self.scopes: list[int] = []  # graph scopes open at this point
        self.next_scope = 0
        self.layer: tuple[int, str, str, int] | None = None  # (scope, id, type, depth) of the open layer
        self.const: _Const | None = None
        self.consts: list[_Const] = []
        self.const_ids: dict[tuple[int, str], int] = {}
        self.layer_ids: set[tuple[int, str]] = set()
        self.converts: dict[tuple[int, str], tuple[str, bool]] = {}  # -> (destination type, decompression)
        self.edges: list[tuple[int, str, str]] = []  # (scope, from Const, to layer)
        self.in_output = False
        self.in_rt_info = False
        self.runtime = ""

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        self.depth += 1
        parent = self.parents[-1] if self.parents else ""
        self.parents.append(tag)
        if self.depth > MAX_DEPTH:
            raise MalformedCheckpoint(f"XML elements nest more than {MAX_DEPTH} deep")
        if self.root is None:
            if tag != "net":
                raise MalformedCheckpoint(f"not an OpenVINO IR: the root element is <{tag[:40]}>, not <net>")
            self.root, self.version = tag, attrs.get("version", "")
            if self.version not in IR_VERSIONS:
                raise MalformedCheckpoint(f"OpenVINO IR version {self.version[:20]!r} is not read "
                                          f"(versions {', '.join(IR_VERSIONS)} are: OpenVINO 2020.1 and later)")
        if tag in GRAPH_TAGS:
            self.scopes.append(self.next_scope)
            self.next_scope += 1
        elif tag == "layer" and self.scopes:
            _require(tag, attrs, LAYER_ATTRIBUTES)
            self._open_layer(attrs)
        elif tag == "edge" and parent == "edges" and self.scopes:  # a TensorIterator's back_edges are its body's
            _require(tag, attrs, EDGE_ATTRIBUTES)
            if (self.scopes[-1], attrs["from-layer"]) not in self.layer_ids:  # read_model tolerates a to-layer
                raise MalformedCheckpoint(f"an edge's from-layer {attrs['from-layer'][:40]!r} is not a layer of "
                                          "its graph")
            key = (self.scopes[-1], attrs.get("from-layer", ""))
            if key in self.const_ids:
                self.edges.append((key[0], key[1], attrs.get("to-layer", "")))
        elif self.layer is not None and self.depth == self.layer[3] + 1:
            self._layer_child(tag, attrs)
        elif self.layer is not None:
            self._layer_detail(tag, attrs)
        elif tag == "info" and attrs.get("name") == "OpenVINO Runtime" and not self.runtime:
            self.runtime = attrs.get("value", "")[:100]

    def _open_layer(self, attrs: dict[str, str]) -> None:
        layer_id = attrs.get("id", "")
        kind = attrs.get("type", "")
        scope = self.scopes[-1]
        self.layer = (scope, layer_id, kind, self.depth)
        if len(self.layer_ids) >= MAX_LAYERS:
            raise MalformedCheckpoint(f"more than {MAX_LAYERS:,} layers")
        self.layer_ids.add((scope, layer_id))
        if kind in CONST_TYPES:
            if len(self.consts) >= MAX_CONSTS:
                raise MalformedCheckpoint(f"more than {MAX_CONSTS:,} constants")
            if (scope, layer_id) in self.const_ids:
                raise MalformedCheckpoint(f"layer id {layer_id[:40]!r} is used twice in one graph")
            self.const = _Const(scope, layer_id, attrs.get("name", ""), self.depth)
            self.const_ids[(scope, layer_id)] = len(self.consts)
            self.consts.append(self.const)

    def _layer_child(self, tag: str, attrs: dict[str, str]) -> None:
        assert self.layer is not None
        if tag == "data":
            if self.const is not None:
                self.const.attrs = dict(attrs)
            elif self.layer[2] == "Convert":
                self.converts[self.layer[:2]] = (attrs.get("destination_type", ""), False)
        elif tag == "output":
            self.in_output = True
        elif tag == "rt_info":
            self.in_rt_info = True

    def _layer_detail(self, tag: str, attrs: dict[str, str]) -> None:
        assert self.layer is not None
        if tag == "port" and self.depth == self.layer[3] + 2:  # <layer><input|output><port>
            _require(tag, attrs, PORT_ATTRIBUTES)
        if self.in_output and tag == "port" and self.const is not None and self.const.port_name is None:
            names = attrs.get("names", "")
            self.const.port_name = _first_name(names) if names else None
        elif self.in_rt_info and tag == "attribute" and attrs.get("name") == "decompression":
            key = self.layer[:2]
            if key in self.converts:
                self.converts[key] = (self.converts[key][0], True)
            elif self.layer[2] == "Convert":
                self.converts[key] = ("", True)

    def end(self, tag: str) -> None:
        if self.layer is not None and self.depth == self.layer[3]:
            self.layer = None
            self.const = None
        elif self.layer is not None and self.depth == self.layer[3] + 1:
            if tag == "output":
                self.in_output = False
            elif tag == "rt_info":
                self.in_rt_info = False
        if tag in GRAPH_TAGS and self.scopes:
            self.scopes.pop()
            # leaving a body: the Loop/TensorIterator/If holding it is no Const, and nothing after the body in
            # it (port maps, back edges) is read, so no layer is open until the next one starts
            self.layer = None
            self.const = None
        self.depth -= 1
        self.parents.pop()


def _require(tag: str, attrs: dict[str, str], names: tuple[str, ...]) -> None:
    """The attributes ``read_model`` refuses an element without (a graph a runtime cannot build); ids are
    unsigned integers."""
    for name in names:
        value = attrs.get(name)
        if value is None:
            raise MalformedCheckpoint(f"<{tag}> is missing its mandatory attribute {name!r}")
        if (name == "id" or "-" in name) and not (value.isascii() and value.isdigit() and len(value) <= 19):
            raise MalformedCheckpoint(f"<{tag}> {name}={value[:40]!r} is not an unsigned integer")


def _first_name(names: str) -> str:
    """The first of a port's comma-separated tensor names (a comma inside one is written ``\\,``)."""
    out, i = [], 0
    while i < len(names):
        ch = names[i]
        if ch == "\\" and i + 1 < len(names):
            out.append(names[i + 1])
            i += 2
            continue
        if ch == ",":
            break
        out.append(ch)
        i += 1
    return "".join(out).strip()


def _refuse(what: str) -> Callable[..., int]:
    def handler(*_args: object) -> int:  # never returns (expat's entity handler is typed to return an int)
        raise MalformedCheckpoint(f"XML {what} refused: an OpenVINO IR has none, and entities are never expanded "
                                  "or fetched")
    return handler


def parse_ir(source: ByteSource) -> _IR:
    if source.size > MAX_XML_BYTES:
        raise MalformedCheckpoint(f"an IR .xml of {source.size:,} bytes (over {MAX_XML_BYTES:,})")
    ir = _IR()
    parser = xml.parsers.expat.ParserCreate()
    parser.SetParamEntityParsing(xml.parsers.expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse("DOCTYPE declaration")
    parser.EntityDeclHandler = _refuse("entity declaration")
    parser.ExternalEntityRefHandler = _refuse("external entity")
    parser.StartElementHandler = ir.start
    parser.EndElementHandler = ir.end
    parser.buffer_text = True
    pos, chunk = 0, FIRST_CHUNK
    try:
        while pos < source.size:
            n = min(chunk, source.size - pos)
            parser.Parse(source.read_at(pos, n), False)
            pos += n
            chunk = CHUNK
        parser.Parse(b"", True)
    except xml.parsers.expat.ExpatError as exc:
        raise MalformedCheckpoint(f"not well-formed XML: {xml.parsers.expat.ErrorString(exc.code)} "
                                  f"at line {exc.lineno}, column {exc.offset}") from None
    if ir.root is None:
        raise MalformedCheckpoint("not an OpenVINO IR: no <net> element")
    return ir


def read_openvino(source: ByteSource) -> FileScan:
    ir = parse_ir(source)
    stem = posixpath.basename(source.name).rpartition(".")[0] or posixpath.basename(source.name)
    companion = f"{stem}.bin"
    bin_path = posixpath.join(posixpath.dirname(source.name), companion)
    decompressed: set[int] = set()
    int_weights: set[int] = set()
    for scope, const_id, target in ir.edges:
        convert = ir.converts.get((scope, target))
        if convert is None:
            continue
        index = ir.const_ids[(scope, const_id)]
        destination, marked = convert
        if marked:
            decompressed.add(index)
        if destination in ("f32", "f16", "bf16"):
            int_weights.add(index)
    tensors: list[TensorInfo] = []
    unknown: dict[str, list[str]] = {}
    compressed = quantized = 0
    for index, const in enumerate(ir.consts):
        info = _tensor(const, bin_path)
        if not dtypes.is_known(info.dtype):
            unknown.setdefault(info.dtype, []).append(info.name)
        if index in decompressed and info.dtype in ("F16", "BF16"):
            compressed += 1
        if index in int_weights and info.dtype in QUANTIZED_WEIGHTS:
            quantized += 1
        tensors.append(info)
    metadata = {"openvino.ir_version": ir.version}
    if ir.runtime:
        metadata["openvino.runtime"] = ir.runtime
    if compressed:
        metadata["openvino.compressed_to_fp16"] = str(compressed)
        metadata["compressed"] = "F16"
        metadata["compressed.hint"] = HINT_F16
    if quantized:
        metadata["quantization"] = "nncf"
        metadata["openvino.quantized_weights"] = str(quantized)
    findings = tuple(
        make_finding("CG005", source.name, f"unknown OpenVINO element type {code.split(':', 1)[1][:40]!r} on "
                     f"{len(names):,} constant(s), e.g. {shown(names[0])}", tensor=names[0])
        for code, names in unknown.items())
    return FileScan(path=source.name, format="openvino", size=source.size, tensors=tuple(tensors),
                    findings=findings, metadata=metadata, bytes_read=getattr(source, "bytes_read", 0),
                    companions=(companion,) if tensors else ())


def _tensor(const: _Const, bin_path: str) -> TensorInfo:
    name = const.port_name or const.layer_name or f"Const#{const.id}"
    attrs = const.attrs
    if attrs is None:
        raise MalformedCheckpoint(f"Const {shown(name)} has no <data> element")
    element = attrs.get("element_type", "")
    code = ELEMENT_TYPES.get(element, f"openvino:{element}")
    shape = _shape(attrs.get("shape"), name)
    offset = _count(attrs, "offset", name)
    size = _count(attrs, "size", name)
    want = dtypes.nbytes(code, prod(shape)) if code != "STRING" else None
    if want is not None and size < want:  # read_model reads the shape's bytes; a longer span it tolerates
        raise MalformedCheckpoint(f"Const {shown(name)}: size {size:,} is short of the {want:,} bytes of "
                                  f"{element}{list(shape)}")
    return TensorInfo(name, code, shape, bin_path, offset, offset + size)


def _shape(text: str | None, name: str) -> tuple[int, ...]:
    if text is None:
        raise MalformedCheckpoint(f"Const {shown(name)} has no shape")
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    if len(parts) > MAX_RANK:
        raise MalformedCheckpoint(f"Const {shown(name)} has {len(parts):,} dimensions (over {MAX_RANK})")
    dims = []
    numel = 1
    for part in parts:
        if not (part.isascii() and part.isdigit()) or len(part) > 19:
            raise MalformedCheckpoint(f"Const {shown(name)}: dimension {part[:20]!r} is not a static size")
        dims.append(int(part))
        numel *= dims[-1]
        if numel >= 2**63:
            raise MalformedCheckpoint(f"Const {shown(name)}: shape {dims[:8]} overflows a 64-bit count")
    return tuple(dims)


def _count(attrs: dict[str, str], key: str, name: str) -> int:
    text = attrs.get(key)
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) >= 2**63:
        raise MalformedCheckpoint(f"Const {shown(name)}: {key} {str(text)[:40]!r} is not a byte count")
    return int(text)
