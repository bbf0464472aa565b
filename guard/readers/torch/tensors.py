"""From walked torch pickles to TensorInfo: storages, tensor names, CG003 findings."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from guard import dtypes, jsonload
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.readers.torch.pickle import (
    _UNTYPED_STORAGES,
    ITEMSIZES,
    MAX_NESTING,
    STORAGE_DTYPES,
    DictDesc,
    Global,
    PickleWalker,
    SetDesc,
    StorageRef,
    SubclassTensor,
    TensorRef,
    Unsafe,
    _bad,
)
from guard.sources import ByteSource, CountingSource  # noqa: F401  (CountingSource: the torch readers')
from guard.tensors import FileScan, TensorInfo


def storage_from_pid(pid: object) -> StorageRef | Unsafe:
    """A persistent id ``('storage', Class, key, location, numel[, view_metadata])``."""
    if not isinstance(pid, tuple) or len(pid) not in (5, 6):
        raise _bad("persistent id is not a 5- or 6-tuple")
    kind, cls, key, _location, numel = pid[:5]
    if isinstance(kind, bytes):
        kind = kind.decode("latin-1")
    if kind != "storage":
        raise _bad(f"persistent id of kind {kind!r}: torch loads only storages")
    dtype = storage_dtype(cls)
    if isinstance(dtype, Unsafe):
        return dtype
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str) or type(numel) is not int or numel < 0:
        raise _bad("persistent id has a bad storage key or element count")
    itemsize = ITEMSIZES[dtype]
    view = pid[5] if len(pid) == 6 else None
    if view is None:
        return StorageRef(key, dtype, numel * itemsize)
    # Pre-1.0 legacy files: a view (view_key, offset, size) into the root storage ``key``.
    if not (isinstance(view, tuple) and len(view) == 3
            and all(type(v) is int and v >= 0 for v in view[1:])):
        raise _bad("persistent id has a malformed storage view")
    _, view_offset, view_size = view
    if view_offset + view_size > numel:
        raise _bad(f"storage view runs past its root storage {key!r}")
    return StorageRef(key, dtype, view_size * itemsize, view_offset * itemsize)


def storage_dtype(cls: object) -> str | Unsafe:
    """The torch dtype of the storage class a persistent id names ("uint8" for untyped storages)."""
    if isinstance(cls, Unsafe):
        return cls
    if not isinstance(cls, Global):
        raise _bad("persistent id names no storage class")
    if cls.dotted in _UNTYPED_STORAGES:
        return "uint8"
    if cls.module in ("torch", "torch.cuda") and cls.name in STORAGE_DTYPES:
        return STORAGE_DTYPES[cls.name]
    raise _bad(f"persistent id names {cls.dotted}, not a storage class")


def iter_named_tensors(root: object, *, budget: int,
                       subclasses: dict[str, SubclassTensor] | None = None) -> Iterator[tuple[str, TensorRef]]:
    """(dotted name, tensor) for every tensor reachable through dicts, lists, tuples and the
    state of objects that were not built.

    A torchao subclass ``P.weight`` yields its plain components under torchao's own safetensors
    names, ``P._weight_qdata``, ``P._weight_scale``...; the subclass itself goes to ``subclasses``.
    ``budget`` bounds the nodes visited, so memo-shared subtrees cannot expand
    exponentially (a "billion laughs" pickle).
    """
    todo: list[tuple[object, tuple[str | None, ...], tuple[int, ...]]] = [(root, (), ())]
    while todo:
        node, path, ancestors = todo.pop()
        budget -= 1
        if budget < 0:
            raise _bad("pickle references expand to too many objects")
        if isinstance(node, TensorRef):
            named = [p for p in path if p is not None]
            yield ".".join(named) if named else "<root>", node
            continue
        if isinstance(node, SubclassTensor):
            named = [p for p in path if p is not None]
            logical = ".".join(named) if named else "<root>"
            if subclasses is not None:
                subclasses.pop(logical, None)
                subclasses[logical] = node
            module, _, attr = logical.rpartition(".")
            stem = f"{module}._{attr}_" if module else f"_{attr}_"
            for key, ref in node.components:
                yield stem + key, ref
            continue
        children: list[tuple[str | None, object]]
        if isinstance(node, DictDesc):
            children = [(_component(k), v) for k, v in node.items]
        elif isinstance(node, (list, tuple)):
            children = [(str(i), v) for i, v in enumerate(node)]
        elif isinstance(node, Unsafe):
            children = _object_children(node)
        else:
            continue
        if id(node) in ancestors:
            continue  # a container that holds itself; torch.load would build the cycle
        if len(path) >= MAX_NESTING:
            raise _bad(f"pickle nests containers more than {MAX_NESTING} deep")
        inner = (*ancestors, id(node))
        todo.extend((v, (*path, k), inner) for k, v in reversed(children))


# An nn.Module's __dict__ keeps its tensors in these; state_dict() names them without the slot.
_MODULE_SLOTS = ("_parameters", "_buffers", "_modules")


def _object_children(node: Unsafe) -> list[tuple[str | None, object]]:
    """An object we never build, named as its state names it (None adds no name component).

    A pickled ``nn.Module`` gets ``state_dict()``'s names (``fc.weight``), its
    non-persistent buffers left out as ``state_dict()`` leaves them.
    """
    children: list[tuple[str | None, object]] = []
    for part in node.parts:
        if not isinstance(part, DictDesc):
            children.append((None, part))
            continue
        hidden = _non_persistent_buffers(part)
        for key, value in part.items:
            name = _component(key)
            if name in _MODULE_SLOTS and isinstance(value, DictDesc):
                if name == "_buffers" and hidden:
                    kept = DictDesc()
                    kept.items.extend(item for item in value.items if _component(item[0]) not in hidden)
                    value = kept
                children.append((None, value))
            else:
                children.append((name, value))
    return children


def _non_persistent_buffers(state: DictDesc) -> set[str]:
    for key, value in state.items:
        if key == "_non_persistent_buffers_set" and isinstance(value, SetDesc):
            return {_component(item) for item in value.items}
    return set()


def _component(key: object) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return key.decode("latin-1")
    if key is None or isinstance(key, (int, float)):
        return str(key)
    return f"<{type(key).__name__}>"


# torch dtype name -> safetensors code; quantized storages are their integer bytes.
TORCH_CODES: dict[str, str] = {**dtypes.TORCH_NAMES, "qint8": "I8", "quint8": "U8", "qint32": "I32"}

Locate = Callable[[StorageRef], "tuple[int, int] | None"]


def build_tensor_infos(
    named: Iterator[tuple[str, TensorRef]], *, file: str, locate: Locate
) -> tuple[tuple[TensorInfo, ...], tuple[Finding, ...]]:
    """TensorInfo records (later duplicates of a name win, as in a dict) and CG005 findings.

    ``locate`` gives the absolute (start, end) of a storage's bytes in the file,
    or None where finding them would cost extra reads.
    """
    infos: dict[str, TensorInfo] = {}
    for name, ref in named:
        itemsize = ITEMSIZES[ref.dtype]
        code = TORCH_CODES.get(ref.dtype, ref.dtype)
        shape, stride = ref.shape, ref.stride
        extent = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        contiguous = _is_contiguous(shape, stride)
        if code == "F4" and shape:  # torch counts packed pairs; the F4 code's shape is logical
            shape = (*shape[:-1], shape[-1] * 2)
            stride = tuple(s * 2 for s in stride[:-1]) + stride[-1:]
        start = end = None
        span = locate(ref.storage) if ref.storage is not None else None
        if span is not None and ref.storage is not None:
            start = span[0] + ref.storage.view_offset + ref.offset * itemsize
            end = start + extent * itemsize
            if extent == 0:
                start = end = min(start, span[1])  # an empty slice reads nothing
            elif end > span[1]:
                raise _bad(f"tensor {name!r} runs past the bytes of storage {ref.storage.key!r}")
        infos.pop(name, None)
        infos[name] = TensorInfo(
            name, code, shape, file, start, end, None if contiguous else stride,
            ref.storage.key if ref.storage is not None else None,
            ref.storage.view_offset + ref.offset * itemsize if ref.storage is not None else None,
        )
    unknown: dict[str, list[str]] = {}
    for info in infos.values():
        if info.dtype not in dtypes.DTYPES:
            unknown.setdefault(info.dtype, []).append(info.name)
    findings = tuple(
        make_finding("CG005", file, f"unknown dtype {dtype!r} on {len(names)} tensor(s), "
                     f"e.g. {shown(names[0])}", tensor=names[0])
        for dtype, names in unknown.items()
    )
    return tuple(infos.values()), findings


def _is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """torch's rule: dims of size 1 may have any stride; empty tensors are contiguous."""
    if 0 in shape:
        return True
    expected = 1
    for n, s in zip(reversed(shape), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def torch_file_scan(source: ByteSource, fmt: str, walker: PickleWalker, root: object,
                    locate: Locate, *, bytes_read: int, storages: int = 0) -> FileScan:
    """The FileScan of a walked torch pickle: its tensors, plus CG003 for what was refused.

    ``storages``: how many storages the file's structure holds.  Storages and no tensor
    read from them is CG001, never a silent empty file.
    """
    budget = max(100_000, 4 * walker.opcodes)  # nodes visited: bounds memo-shared blow-ups
    subclasses: dict[str, SubclassTensor] = {}
    tensors, findings = build_tensor_infos(iter_named_tensors(root, budget=budget, subclasses=subclasses),
                                           file=source.name, locate=locate)
    metadata = pickle_metadata(walker)
    if subclasses:
        metadata["torchao_subclasses"] = subclass_metadata(subclasses)
    return FileScan(
        path=source.name, format=fmt, size=source.size, tensors=tensors,
        findings=(*unsafe_findings(walker, source.name), *findings,
                  *no_tensor_findings(walker, source.name, storages=storages, tensors=len(tensors))),
        metadata=metadata, bytes_read=bytes_read,
    )


def subclass_metadata(subclasses: dict[str, SubclassTensor]) -> str:
    """JSON {logical name: {"_type", "shape", "dtype", "_tensor_data_names", attributes...}}: torchao's own
    safetensors record of a subclass (``flatten_tensor_state_dict``) plus the logical shape the pickle gives."""
    import json

    records = {}
    for name, sub in subclasses.items():
        record: dict[str, object] = {"_type": sub.cls.rpartition(".")[2], "shape": list(sub.shape),
                                     "dtype": sub.dtype, "_tensor_data_names": [key for key, _ in sub.components]}
        record.update((key, value) for key, value in sub.attributes if key not in record)
        records[name] = record
    return json.dumps(records, sort_keys=True)


def torchao_subclasses(metadata: Mapping[str, str]) -> dict[str, dict[str, object]]:
    """The torchao subclasses a file describes, from either layout, keyed by logical tensor name.

    A pickle read here: ``metadata["torchao_subclasses"]``.  A safetensors file torchao wrote:
    ``tensor_names`` plus one JSON record per name whose ``_type`` is not a plain ``Tensor``
    (its shape is the qdata's, filled in by the caller from the header when it needs it).
    Malformed metadata gives an empty result, never an exception: it is attacker-controlled text.
    """
    try:
        if "torchao_subclasses" in metadata:
            found = jsonload.loads(metadata["torchao_subclasses"])
            return {k: v for k, v in found.items() if isinstance(v, dict)} if isinstance(found, dict) else {}
        names = jsonload.loads(metadata["tensor_names"]) if "tensor_names" in metadata else []
        out: dict[str, dict[str, object]] = {}
        for name in names if isinstance(names, list) else []:
            record = jsonload.loads(metadata.get(name, "null")) if isinstance(name, str) else None
            if isinstance(record, dict) and record.get("_type") not in (None, "Tensor", "torch.Tensor"):
                data = record.get("_data")
                if not isinstance(data, dict):
                    data = {}
                out[name] = {"_type": record["_type"], "_tensor_data_names": record.get("_tensor_data_names"),
                             **{k: v for k, v in data.items() if isinstance(v, (int, float, str, list, type(None)))}}
        return out
    except (ValueError, TypeError, RecursionError):
        return {}


def no_tensor_findings(walker: PickleWalker, path: str, *, storages: int, tensors: int) -> tuple[Finding, ...]:
    if tensors or not storages:
        return ()
    through = f" (they are built through {', '.join(list(walker.unsafe)[:3])})" if walker.unsafe else ""
    return (make_finding("CG001", path, f"unreadable checkpoint: the file holds {storages:,} storage(s) but no "
                         f"tensor could be read from its pickle{through}"),)


def pickle_metadata(walker: PickleWalker) -> dict[str, str]:
    """The refused globals by name, so the inventory can judge them by the file's role; how many tensors
    are torch-quantized (their bytes are integers whose scales only the pickle holds)."""
    metadata = {"pickle_globals": " ".join(sorted(walker.unsafe))} if walker.unsafe else {}
    if walker.quantized:
        metadata["torch_quantized_tensors"] = str(walker.quantized)
    return metadata


def unsafe_findings(walker: PickleWalker, path: str) -> tuple[Finding, ...]:
    return tuple(
        make_finding("CG003", path, f"pickle references {dotted}, which is not in the tensor "
                     "allowlist (it was not imported or called)")
        for dotted in walker.unsafe
    )


def unsafe_and_unreadable(
    source: ByteSource, fmt: str, walker: PickleWalker, exc: MalformedCheckpoint, bytes_read: int
) -> FileScan:
    """A file with unsafe globals that is also malformed: keep both verdicts."""
    broken = make_finding("CG001", source.name, f"unreadable checkpoint: {exc}")
    return FileScan(path=source.name, format=fmt, size=source.size,
                    findings=(*unsafe_findings(walker, source.name), broken), bytes_read=bytes_read,
                    metadata=pickle_metadata(walker))
