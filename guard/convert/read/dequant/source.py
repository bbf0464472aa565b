"""A quantized source seen as its full-precision model: each quantized module becomes its dequantized weight.

``open_quantization`` asks the inventory (``guard.inventory.quantization``) what the weight set convert
reads is quantized with and which modules it packs.  ``dequantized_source`` then rewrites the source's
tensor list: every payload and component is consumed; in the payload's place stand the module's outputs,
planned from headers (and small records such as bnb's quant_state) as float32 tensors whose loader
dequantizes the module when the writer reaches it.  Everything else passes through untouched, so the
writer's one cast (``--dtype``) is the only rounding a dequantized value sees, and an unquantized tensor
is copied or cast exactly as plain ``convert`` would.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guard.catalogue import make_finding
from guard.convert.read.dequant import DequantError, dequantizer
from guard.convert.read.source import SourceModel
from guard.errors import MalformedCheckpoint, UsageError
from guard.findings import Finding
from guard.records import Record
from guard.tensors import TensorInfo
from guard.write.plan import SourceTensor

if TYPE_CHECKING:
    import numpy as np


class Quantized(Record):
    """What the inventory says about the set convert reads."""

    quant: Any  # guard.inventory.quantization.Quantization
    modules: tuple[Any, ...]  # its QuantModule records
    findings: list[Finding]  # the integrity rules' errors (CG110-CG113)


def open_quantization(src: Path, source: SourceModel) -> Quantized | None:
    """The quantization of the weight set ``source`` holds, or None for a full-precision one."""
    from guard.inventory import discover_models, load_local_model
    from guard.inventory.quantization import quantized_modules

    models = [m for m in discover_models([src]) if Path(m.directory).resolve() == src.resolve()]
    if not models:
        return None
    inventory = load_local_model(models[0])
    names = {p.name for p in source.files}
    ws = next((s for s in inventory.sets if {Path(f.path).name for f in s.files} == names), None)
    if ws is None:
        return None
    quant = inventory.quantization(ws)
    if quant is None:
        return None
    return Quantized(quant, tuple(quantized_modules(inventory, ws)), _integrity_findings(inventory, names))


def _integrity_findings(inventory: Any, names: set[str]) -> list[Finding]:
    """The scanner's CG110-CG112 errors from headers (missing component, shapes against bits and group size,
    method against tensors) on the files convert reads: refused before any payload is read.  CG113
    (a module the config keeps unquantized is packed) is no obstacle: it is dequantized like the rest."""
    from guard.config import Policy
    from guard.rules.quantized import check_quantization_method, check_quantized_components, check_quantized_shapes

    found: list[Finding] = []
    for check in (check_quantized_components, check_quantized_shapes, check_quantization_method):
        found += [f for f in check(inventory, Policy()) if f.severity.value == "error"
                  and (Path(f.path).name in names or Path(f.path).name.endswith(".json"))]
    return found


class _Reader:
    """``read(name)`` for dequantizers: one stored tensor at a time, by its name in the set."""

    def __init__(self, by_name: dict[str, SourceTensor], config: dict[str, Any] | None) -> None:
        self.by_name, self.config = by_name, config

    def info(self, name: str) -> TensorInfo:
        """A stored tensor's header record (dtype, shape), nothing read."""
        tensor = self.by_name.get(name)
        if tensor is None:
            raise DequantError("CG110", name, "a component the quantized module needs is not in the weight set")
        return tensor.info

    def __call__(self, name: str) -> np.ndarray:
        tensor = self.by_name.get(name)
        if tensor is None:
            raise DequantError("CG110", name, "a component the quantized module needs is not in the weight set")
        try:
            return tensor.load()
        except MalformedCheckpoint as exc:
            raise DequantError("CG001", name, str(exc).splitlines()[0][:200]) from None

    def elements(self, name: str, flat: list[int]) -> np.ndarray:
        """A stored tensor's elements at C-order flat indices, in its stored dtype: read from its byte range
        in the file where it has one (nothing else read), else from the loaded tensor."""
        import numpy as np

        from guard.write.bitviews import numpy_dtype
        from guard.write.produce import ranged
        from guard.write.verify import read_elements

        tensor = self.by_name.get(name)
        if tensor is None:
            raise DequantError("CG110", name, "a component the quantized module needs is not in the weight set")
        info = tensor.info
        if not ranged(tensor):
            return np.array(self(name).reshape(-1)[flat])
        assert info.data_start is not None and info.data_end is not None
        return read_elements([(Path(info.file), info.data_start, info.data_end - info.data_start)], flat,
                             numpy_dtype(info.dtype))


# The next module is dequantized on a second core while the writer casts and writes this one, when its
# float32 result is at most this big (so at most two modules' arrays are alive, well inside the bound).
PREFETCH_BYTES = 256 * 2**20


class _Modules:
    """Each module's arrays, made once per visit: the one being written is kept (a module with several
    outputs is dequantized once), and the next one in the writer's order is made ahead in a thread.

    The read-back check compares the written file with the source itself: a dequantizer with ``elements``
    recomputes only the sampled elements from the source file (``_ModuleLoader.elements``); for the
    others it visits every module again and recomputes it whole.  Where the writer's order is not the plan's (a
    msgpack tree is written sorted by key), the first miss turns making ahead off; nothing else depends on it.
    """

    def __init__(self, quant: Any, impl: Any, read: _Reader, *, ahead: bool) -> None:
        self.quant, self.impl, self.read, self.ahead = quant, impl, read, ahead
        self.order: list[Any] = []  # modules in the order their outputs stand in the plan
        self.sizes: dict[int, int] = {}
        self.current: tuple[Any, dict[str, Any]] = (None, {})
        self.pending: tuple[Any, Any] | None = None  # (module, future)
        self.executor: Any = None

    def arrays(self, module: Any) -> dict[str, Any]:
        if self.current[0] is module:
            return self.current[1]
        self.current = (None, {})  # free the previous module's arrays before making these
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] is module:
            arrays = pending[1].result()
        else:
            if pending is not None:
                pending[1].cancel()
                self.ahead = False
            arrays = self.impl.dequantize(module, self.quant, self.read)
        self.current = (module, arrays)
        self._make_next(module)
        return arrays

    def _make_next(self, module: Any) -> None:
        if not self.ahead or len(self.order) < 2:
            return
        index = next(i for i, m in enumerate(self.order) if m is module)
        if index + 1 == len(self.order) and hasattr(self.impl, "elements"):
            return  # the read-back check recomputes only sampled elements: nothing to make ahead for it
        following = self.order[(index + 1) % len(self.order)]  # after the last: the read-back check's first
        if self.sizes.get(id(following), 0) > PREFETCH_BYTES:
            return
        if self.executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self.executor = ThreadPoolExecutor(1, thread_name_prefix="ckpt-guard-dequantize")
        self.pending = (following, self.executor.submit(self.impl.dequantize, following, self.quant, self.read))


class _ModuleLoader:
    """The loader of one module's planned outputs: its arrays from the shared ``_Modules``."""

    def __init__(self, module: Any, modules: _Modules) -> None:
        self.module, self.modules = module, modules

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        array = self.modules.arrays(self.module).get(info.name)
        if array is None or array.dtype != np.float32 or tuple(array.shape) != info.shape:
            got = "nothing" if array is None else f"{array.dtype} {list(array.shape)}"
            raise AssertionError(f"{info.name}: the {self.modules.quant.method} dequantizer made {got}, planned "
                                 f"float32 {list(info.shape)}")
        return array

    def elements(self, info: TensorInfo, flat: list[int]) -> np.ndarray:
        """float32 values of output ``info`` at C-order flat indices, recomputed from the source: only those
        elements where the dequantizer offers ``elements`` (the same arithmetic, bit for bit), else the
        whole module dequantized again."""
        import numpy as np

        impl, modules = self.modules.impl, self.modules
        if hasattr(impl, "elements"):
            values = impl.elements(self.module, modules.quant, modules.read, info.name, flat)
            if values is not None:
                return np.asarray(values, dtype=np.float32)
        return np.array(self.load(info).reshape(-1)[flat])


def dequantized_source(source: SourceModel, quantized: Quantized, config: dict[str, Any] | None) -> SourceModel:
    """``source`` with each quantized module replaced by its planned float32 outputs (DequantError at plan time)."""
    quant = quantized.quant
    impl = dequantizer(quant.method)
    if impl is None:
        raise UsageError(f"{source.files[0].parent}: --dequantize does not know {quant.method!r} "
                         f"({quant.label}) yet; nothing written")
    by_name = {t.name: t for t in source.tensors}
    read = _Reader(by_name, config)
    # a second thread reads only through byte ranges (safetensors); torch's .bin loader keeps one open shard
    shared = _Modules(quant, impl, read, ahead=source.format == "safetensors")
    consumed: set[str] = set()
    planned: dict[str, tuple[Any, list[SourceTensor]]] = {}  # payload name -> its module, the outputs in its place
    for module in quantized.modules:
        if getattr(module, "missing", ()):
            raise DequantError("CG110", module.payload, f"the quantized module has no {', '.join(module.missing)}")
        loader = _ModuleLoader(module, shared)
        shapes = (impl.outputs(module, quant, read) if hasattr(impl, "outputs")
                  else {module.weight: module.logical_shape})
        file = by_name[module.payload].info.file if module.payload in by_name else str(source.files[0])
        outs = []
        for name, shape in shapes.items():
            if shape is None:
                raise DequantError("CG111", module.payload, "the headers do not say the dequantized weight's shape")
            outs.append(SourceTensor(TensorInfo(name, "F32", tuple(int(d) for d in shape), file), loader))
        planned[module.payload] = module, outs
        shared.sizes[id(module)] = sum(4 * prod(t.info.shape) for t in outs)
        consumed.update((module.payload, *module.components.values()))
    tensors: list[SourceTensor] = []
    for tensor in source.tensors:
        if tensor.name in planned:
            module, outs = planned.pop(tensor.name)
            if outs:
                shared.order.append(module)
            tensors.extend(outs)
        elif tensor.name not in consumed:
            tensors.append(tensor)
    if planned:  # a module whose payload the set does not hold
        missing = next(iter(planned))
        raise DequantError("CG110", missing, "the packed weight of a quantized module is not in the weight set")
    _check_unique(tensors)
    return replace(source, tensors=tensors, findings=list(source.findings))


def _check_unique(tensors: list[SourceTensor]) -> None:
    seen: set[str] = set()
    for tensor in tensors:
        if tensor.name in seen:
            raise DequantError("CG112", tensor.name, "a dequantized weight would replace a tensor the set already "
                                                     "holds under that name")
        seen.add(tensor.name)


def refusal(error: DequantError, source: SourceModel) -> Finding:
    """The finding a dequantizer's complaint becomes (its file: the tensor's, where the set holds it)."""
    path = next((t.info.file for t in source.tensors if t.name == error.tensor), str(source.files[0]))
    return make_finding(error.code, path, f"{error.tensor}: cannot dequantize: {error.message}", tensor=error.tensor)
