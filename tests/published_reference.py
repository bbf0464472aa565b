"""What the reference loaders see in a published model file: ``{name: (dtype code, shape)}``.

Each loader is the library the file's users load it with. Where a format keeps weights in more
than one place, every place is walked (ONNX: tests/onnx_reference.py; TorchScript: tensor
attributes and code constants). Parameters of a sparse tensor are its dense shape's
elements, as its format declares it.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from pathlib import Path

from fuzz_inputs import Inventory, reference_safetensors, reference_torch, torch_code
from real_writers import h5_listing

from guard.dtypes import NUMPY_NAMES


def _code(numpy_name: str) -> str:
    return NUMPY_NAMES.get(numpy_name, numpy_name)


def _refused(what: Inventory | str) -> Inventory:
    assert not isinstance(what, str), f"the reference loader refused a published file: {what}"
    return what


def torch_load(path: Path) -> Inventory:
    return _refused(reference_torch(path.read_bytes()))


def safetensors_load(path: Path) -> Inventory:
    return _refused(reference_safetensors(path.read_bytes()))


def torchscript(path: Path) -> Inventory:
    """``torch.jit.load``: every tensor attribute of every submodule (parameters, buffers and plain
    tensor attributes: all of ``data/``), and the tensors the code holds as constants."""
    import torch

    module = torch.jit.load(str(path), map_location="cpu")
    out: Inventory = {}
    seen: dict[int, torch.Tensor] = {}  # by identity: a constant the code of several submodules shares is one
    for prefix, sub in module.named_modules():
        for name, value in torch._C._jit_debug_module_iterators(sub._c)["named_attributes"]:
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                seen[id(value)] = value  # held, so that no id is reused
                out[f"{prefix}.{name}" if prefix else name] = (torch_code(value), tuple(value.shape))
        try:
            constants = sub.code_with_constants[1].const_mapping
        except (AttributeError, RuntimeError):  # a submodule without forward code
            continue
        for name, value in constants.items():
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                seen[id(value)] = value
                out[f"constants/{prefix}/{name}"] = (torch_code(value), tuple(value.shape))
    return out


def onnx_graph(path: Path) -> Inventory:
    """``onnx.load``, every place a weight can live walked (tests/onnx_reference.py)."""
    import onnx
    from onnx_reference import onnx_weights

    model = onnx.load(str(path), load_external_data=False)
    return {name: (code, shape) for name, code, shape in onnx_weights(model)}


# tflite's TensorType names, as numpy names them
_TFLITE_NUMPY = {"FLOAT32": "float32", "FLOAT16": "float16", "FLOAT64": "float64", "INT8": "int8", "UINT8": "uint8",
                 "INT16": "int16", "UINT16": "uint16", "INT32": "int32", "UINT32": "uint32", "INT64": "int64",
                 "UINT64": "uint64", "BOOL": "bool", "COMPLEX64": "complex64", "COMPLEX128": "complex128"}


def tflite_model(path: Path) -> Inventory:
    """The ``tflite`` parser: a tensor whose buffer holds data (in the flatbuffer, or past it by
    offset and size) is a constant; its shape is the dense one, sparse or not."""
    import tflite

    names = {v: k for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}
    data = path.read_bytes()
    model = tflite.Model.GetRootAsModel(data, 0)
    out: Inventory = {}
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        for i in range(graph.TensorsLength()):
            tensor = graph.Tensors(i)
            buffer = model.Buffers(tensor.Buffer())
            if buffer is None or (buffer.DataLength() == 0 and buffer.Size() == 0):
                continue
            kind = names[tensor.Type()]
            out[f"{s}/{i}/{tensor.Name().decode(errors='replace')}"] = (
                _code(_TFLITE_NUMPY.get(kind, kind)), tuple(int(d) for d in tensor.ShapeAsNumpy()) if
                tensor.ShapeLength() else ())
    return out


def tf_variables(folder: Path) -> Inventory:
    """``tf.train.list_variables`` on the SavedModel's tensor bundle, less what is no weight of the model:
    string entries (the object graph) and the optimizer's state (its slots and its own variables)."""
    import tensorflow as tf

    prefix = str(folder / "variables" / "variables")
    dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
    return {name: (_code(dtypes[name].name), tuple(shape)) for name, shape in tf.train.list_variables(prefix)
            if dtypes[name] != tf.string and ".OPTIMIZER_SLOT" not in name.split("/")
            and not name.startswith("optimizer/")}


def h5_file(path: Path) -> Inventory:
    import h5py

    with h5py.File(path, "r") as h5:
        return {name: (code, tuple(shape)) for name, (code, shape) in h5_listing(h5).items()}


def coreml_package(folder: Path) -> Inventory:
    """coremltools' spec of an ML program: its ``const`` ops whose value lives in blob storage, one per
    blob, each read back by coremltools' own blob reader (inline values are op arguments: axes, scalars)."""
    import coremltools
    from coremltools.libmilstoragepython import _BlobStorageReader
    from coremltools.proto import MIL_pb2

    spec = coremltools.utils.load_spec(str(folder))
    readers: dict[str, _BlobStorageReader] = {}
    out: Inventory = {}
    for function in spec.mlProgram.functions.values():
        for block in function.block_specializations.values():
            for op in block.operations:
                value = op.attributes.get("val") if op.type == "const" else None
                if value is None or value.WhichOneof("value") != "blobFileValue":
                    continue
                blob, tensor = value.blobFileValue, value.type.tensorType
                kind = MIL_pb2.DataType.Name(tensor.dataType).lower()
                shape = tuple(int(d.constant.size) for d in tensor.dimensions)
                # "@model_path/weights/weight.bin" is relative to the package's Data/com.apple.CoreML
                path = str(folder / "Data" / "com.apple.CoreML" / blob.fileName.removeprefix("@model_path/"))
                reader = readers.setdefault(path, _BlobStorageReader(path))
                method = {"float32": "float", "float16": "fp16"}.get(kind, kind)
                stored = len(getattr(reader, f"read_{method}_data")(blob.offset))
                assert stored == prod(shape), f"{op.outputs[0].name}: {stored} values in the blob, shape {shape}"
                out[f"{blob.fileName}@{blob.offset}"] = (_code(kind), shape)
    return out


REFERENCES: dict[str, Callable[[Path], Inventory]] = {
    "torch.load": torch_load,
    "torch.jit.load": torchscript,
    "onnx": onnx_graph,
    "tflite": tflite_model,
    "tf.train.list_variables": tf_variables,
    "h5py": h5_file,
    "coremltools": coreml_package,
    "safetensors": safetensors_load,
}


def dtype_counts(inventory: Inventory) -> dict[str, tuple[int, int]]:
    """dtype code -> (tensors, parameters), as a scan report's ``dtypes`` gives them."""
    out: dict[str, tuple[int, int]] = {}
    for code, shape in inventory.values():
        tensors, parameters = out.get(code, (0, 0))
        out[code] = (tensors + 1, parameters + prod(shape))
    return out
