"""The reference inventory of an ONNX model: ``onnx.load``'s protos, every place a weight can live walked.

Not a test module.  ``onnx_weights`` lists what ``guard.readers.onnx.graph`` must list, by the
rules its docstring states: initializers and sparse initializers of every graph,
Constant nodes (``value``, ``sparse_value``, ``value_float(s)``, ``value_int(s)``,
``value_string(s)``), the tensors in the attributes of every other node (``t``,
``sparse_tensor``, ``tensors``, ``sparse_tensors``: ConstantOfShape's ``value``, a
custom operator's tensors), named ``<node>/<attribute>`` (``[k]`` in a list),
subgraphs of GRAPH and GRAPHS attributes to any depth, and the nodes of
``model.functions``; breadth first, the main graph then the functions, the node
tensors named after the graph's initializers, in node order.  Written against the
protobuf classes of the ``onnx`` package, sharing no code with the reader.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

Weight = tuple[str, str, tuple[int, ...]]
SCALARS = {"value_float": ("f", "F32"), "value_int": ("i", "I64"), "value_string": ("s", "STRING")}
LISTS = {"value_floats": ("floats", "F32"), "value_ints": ("ints", "I64"), "value_strings": ("strings", "STRING")}


def _code(data_type: int) -> str:
    from guard.readers.onnx.schema import DATA_TYPES

    return DATA_TYPES.get(data_type, f"onnx:{data_type}")


def _esc(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


def _text(name: str | bytes) -> str:
    return name.decode("utf-8", "backslashreplace") if isinstance(name, bytes) else name


def constant_value(node: Any, check: Callable[[Any], None]) -> tuple[str, tuple[int, ...]] | None:
    """(dtype, shape) of a Constant node's first value attribute; ``check`` sees each TensorProto."""
    for attr in node.attribute:
        if attr.ref_attr_name:
            continue
        if attr.name == "value" and attr.HasField("t"):
            check(attr.t)
            return _code(attr.t.data_type), tuple(attr.t.dims)
        if attr.name == "sparse_value" and attr.HasField("sparse_tensor"):
            check(attr.sparse_tensor.values)
            check(attr.sparse_tensor.indices)
            return _code(attr.sparse_tensor.values.data_type), tuple(attr.sparse_tensor.dims)
        if attr.name in SCALARS and attr.HasField(SCALARS[attr.name][0]):
            return SCALARS[attr.name][1], ()
        if attr.name in LISTS:
            field, code = LISTS[attr.name]
            return code, (len(getattr(attr, field)),)
    return None


def attribute_tensors(node: Any, where: str,
                      check: Callable[[Any], None]) -> list[tuple[str, tuple[str, tuple[int, ...]]]]:
    """(name, (dtype, shape)) of every tensor in the attributes of a node that is not a Constant."""
    out = []
    for attr in node.attribute:
        if attr.ref_attr_name:
            continue
        name = f"{where}{_esc(_text(attr.name))}"
        if attr.HasField("t"):
            check(attr.t)
            out.append((name, (_code(attr.t.data_type), tuple(attr.t.dims))))
        if attr.HasField("sparse_tensor"):
            check(attr.sparse_tensor.values)
            check(attr.sparse_tensor.indices)
            out.append((name, (_code(attr.sparse_tensor.values.data_type), tuple(attr.sparse_tensor.dims))))
        for k, t in enumerate(attr.tensors):
            check(t)
            out.append((f"{name}[{k}]", (_code(t.data_type), tuple(t.dims))))
        for k, sparse in enumerate(attr.sparse_tensors):
            check(sparse.values)
            check(sparse.indices)
            out.append((f"{name}[{k}]", (_code(sparse.values.data_type), tuple(sparse.dims))))
    return out


def onnx_weights(model: Any, check: Callable[[Any], None] = lambda t: None) -> list[Weight]:
    """Every weight of ``model`` (an onnx ModelProto) as (name, dtype, shape), in the reader's order."""
    out: list[Weight] = []
    names: set[str] = set()

    def add(name: str, code: str, shape: tuple[int, ...]) -> None:
        out.append((name, code, shape))
        names.add(name)

    queue: deque[tuple[Any, str, bool]] = deque([(model.graph, "", False)])
    for fn in model.functions:
        label = f"{_text(fn.domain)}.{_text(fn.name)}" + (f"@{_text(fn.overload)}" if fn.overload else "")
        queue.append((fn, f"functions/{_esc(label)}/", True))
    while queue:
        graph, prefix, function = queue.popleft()
        if not function:
            for t in graph.initializer:
                check(t)
                add(_text(t.name), _code(t.data_type), tuple(t.dims))
            for s in graph.sparse_initializer:
                check(s.values)
                check(s.indices)
                add(_text(s.values.name), _code(s.values.data_type), tuple(s.dims))
        constants = []
        for i, node in enumerate(graph.node):
            label = _esc(_text(node.name) or f"{_text(node.op_type)}#{i}")
            for attr in node.attribute:
                if attr.HasField("g"):
                    queue.append((attr.g, f"{prefix}{label}/{_esc(_text(attr.name))}/", False))
                for k, sub in enumerate(attr.graphs):
                    queue.append((sub, f"{prefix}{label}/{_esc(_text(attr.name))}[{k}]/", False))
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = constant_value(node, check)
                if value is not None:
                    base = _text(node.output[0] if node.output else "") or _text(node.name) or f"Constant#{i}"
                    constants.append((f"{prefix}{_esc(base)}" if prefix else base, value))
            else:
                constants.extend(attribute_tensors(node, f"{prefix}{label}/", check))
        for name, (code, shape) in constants:
            unique, n = name, 2
            while unique in names:
                unique, n = f"{name}#{n}", n + 1
            add(unique, code, shape)
    return out


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload
