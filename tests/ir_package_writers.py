"""OpenVINO IR and Core ML files written by the real tools, in one child process, with references.

torch, openvino and coremltools take seconds to import, so a test module calls
``built(kind, tmp_path_factory)`` once; the child writes the files and
``reference.json``: for each file, [[dtype code, shape], ...] as the reference
reader reports it (``openvino.Core().read_model``'s Constant ops;
coremltools' spec and ``libmilstoragepython``'s blob reader for packages).

    python tests/ir_package_writers.py openvino|coreml OUT_DIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OV_TYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "f64": "F64", "i8": "I8", "u8": "U8", "i4": "I4", "u4": "U4",
            "i32": "I32", "i64": "I64", "boolean": "BOOL", "u2": "U2", "nf4": "NF4", "string": "STRING"}
_BUILT: dict[str, tuple[Path, dict[str, Any]]] = {}


def built(kind: str, tmp_path_factory: Any) -> tuple[Path, dict[str, Any]]:
    if kind not in _BUILT:
        out = tmp_path_factory.mktemp(kind)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, str(Path(__file__)), kind, str(out)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _BUILT[kind] = out, json.loads((out / "reference.json").read_text())
    return _BUILT[kind]


def openvino_constants(xml: str) -> list[list[Any]]:
    """The reference: every Constant op of ``read_model`` (bodies of TensorIterator/Loop/If included)."""
    import openvino as ov

    out: list[list[Any]] = []

    def walk(model: Any) -> None:
        for op in model.get_ordered_ops():
            if op.get_type_name() == "Constant":
                out.append([OV_TYPES.get(op.get_element_type().get_type_name(), op.get_element_type().get_type_name()),
                            [int(d) for d in op.get_output_shape(0)]])
            if op.get_type_name() in ("Loop", "TensorIterator"):  # a body is a graph of its own
                walk(op.get_function())
            elif op.get_type_name() == "If":
                walk(op.get_then_body())
                walk(op.get_else_body())

    walk(ov.Core().read_model(xml))
    return sorted(out)


def _torch_module() -> Any:
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(64, 128)
            self.fc2 = torch.nn.Linear(128, 32)
            self.norm = torch.nn.LayerNorm(32)
            with torch.no_grad():
                self.norm.weight.uniform_(0.5, 1.5)  # not folded away as the identity

        def forward(self, x: Any) -> Any:
            return self.norm(self.fc2(torch.relu(self.fc1(x))))

    torch.manual_seed(0)
    return Block().eval()


def build_openvino(out: Path) -> dict[str, Any]:
    import numpy as np
    import openvino as ov
    import torch
    from openvino import opset13 as ops

    model = ov.convert_model(_torch_module(), example_input=torch.zeros(2, 64))
    ov.save_model(model, str(out / "compressed.xml"))  # compress_to_fp16=True, the default
    ov.save_model(model, str(out / "fp32.xml"), compress_to_fp16=False)
    # NNCF-style int8 and int4 weight compression: integer constants, a zero point and a scale per row
    x = ops.parameter([1, 64], np.float32, name="x")
    h = x
    for i, (bits, kind) in enumerate(((8, ov.Type.u8), (4, ov.Type.u4))):
        weight = ops.constant(np.random.default_rng(i).integers(0, 2**bits, (64, 64)).astype(np.uint8), kind,
                              name=f"layer{i}.weight")
        zero = ops.constant(np.full((64, 1), 2 ** (bits - 1), np.uint8), kind, name=f"layer{i}.weight/zero_point")
        scale = ops.constant(np.full((64, 1), 0.01, np.float16), name=f"layer{i}.weight/scale")
        dequantized = ops.multiply(ops.convert(ops.subtract(ops.convert(weight, np.float16),
                                                            ops.convert(zero, np.float16)), np.float16), scale)
        h = ops.matmul(h, ops.convert(dequantized, np.float32), False, True)
    ov.save_model(ov.Model([h], [x], "nncf_like"), str(out / "int8.xml"), compress_to_fp16=False)
    # a Loop: its body is a graph of its own, with constants (and back_edges naming the body's layers)
    trip, body_x = ops.constant(np.int64(3)), ops.parameter([1, 64], np.float32, name="body_x")
    body_out = ops.matmul(body_x, ops.constant(np.eye(64, dtype=np.float32), name="body.weight"), False, False)
    loop = ops.loop(trip, ops.constant(True))
    loop.set_function(ov.Model([ops.constant(True), body_out], [body_x], "body"))
    loop.set_special_body_ports([-1, 0])
    loop.set_merged_input(body_x, x.output(0), body_out.output(0))
    ov.save_model(ov.Model([loop.get_iter_value(body_out.output(0), -1)], [x], "loop"), str(out / "loop.xml"))
    # optimum-intel's layout: the IR beside the PyTorch weights and config.json
    folder = out / "optimum"
    folder.mkdir()
    ov.save_model(model, str(folder / "openvino_model.xml"), compress_to_fp16=False)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in _torch_module().state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "mlp", "torch_dtype": "float32"}))
    names = ("compressed.xml", "fp32.xml", "int8.xml", "loop.xml", "optimum/openvino_model.xml")
    return {name: openvino_constants(str(out / name)) for name in names}


def coreml_blobs(package: Path) -> list[list[Any]]:
    """The reference: the ML program's const ops that live in a blob file, read by coremltools' blob reader."""
    import coremltools as ct
    from coremltools.libmilstoragepython import _BlobStorageReader

    spec = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
    function = spec.mlProgram.functions["main"]
    readers: dict[str, Any] = {}
    out = []
    kinds = {10: ("F16", "read_fp16_data"), 11: ("F32", "read_float_data"), 21: ("I8", "read_int8_data"),
             31: ("U8", "read_uint8_data")}  # MIL.proto DataType -> (code, reader method)
    for op in function.block_specializations[function.opset].operations:
        value = op.attributes["val"] if op.type == "const" else None
        if value is None or not value.HasField("blobFileValue"):
            continue
        file = value.blobFileValue.fileName.replace("@model_path/", "")
        path = package / "Data" / "com.apple.CoreML" / file
        reader = readers.setdefault(file, _BlobStorageReader(str(path)))
        code, method = kinds[op.outputs[0].type.tensorType.dataType]
        data = getattr(reader, method)(value.blobFileValue.offset)
        out.append([f"{file}@{value.blobFileValue.offset}", code, [len(data)]])
    return sorted(out)


def build_coreml(out: Path) -> dict[str, Any]:
    import coremltools as ct
    import torch

    traced = torch.jit.trace(_torch_module(), torch.zeros(1, 64))
    inputs = [ct.TensorType(shape=(1, 64))]
    # names that claim no dtype: the default stores fp16, compute_precision=FLOAT32 fp32
    ct.convert(traced, inputs=inputs, convert_to="mlprogram").save(str(out / "default.mlpackage"))
    ct.convert(traced, inputs=inputs, convert_to="mlprogram",
               compute_precision=ct.precision.FLOAT32).save(str(out / "full.mlpackage"))
    # a neural network keeps its weights in the spec: fp32, then fp16 and 8-bit as quantize_weights writes them
    from coremltools.models.neural_network import quantization_utils

    network = ct.convert(traced, inputs=inputs, convert_to="neuralnetwork")
    network.save(str(out / "network.mlmodel"))
    for bits in (16, 8):
        quantized = quantization_utils.quantize_weights(network, nbits=bits)
        ct.utils.save_spec(getattr(quantized, "get_spec", lambda: quantized)(),  # noqa: B023 (called within this iteration)
                           str(out / f"network{bits}.mlmodel"))
    reference: dict[str, Any] = {name: coreml_blobs(out / name) for name in ("default.mlpackage", "full.mlpackage")}
    return {**reference, **{name: coreml_weight_params(out / name)
                            for name in ("network.mlmodel", "network16.mlmodel", "network8.mlmodel")}}


def coreml_weight_params(path: Path) -> list[list[Any]]:
    """The reference for a neural network: every non-empty WeightParams of its layers, as coremltools loads it."""
    import coremltools as ct
    from coremltools.proto import NeuralNetwork_pb2

    out = []
    for layer in ct.utils.load_spec(str(path)).neuralNetwork.layers:
        for field, value in getattr(layer, layer.WhichOneof("layer")).ListFields():
            if not isinstance(value, NeuralNetwork_pb2.WeightParams):
                continue
            bits = value.quantization.numberOfBits or 8
            kinds = [("F32", len(value.floatValue)), ("F16", len(value.float16Value) // 2),
                     ({8: "U8", 4: "U4", 2: "U2"}.get(bits, "?"), len(value.rawValue) * 8 // bits),
                     ("I8", len(value.int8RawValue))]
            out += [[f"{layer.name}.{field.name}", code, [n]] for code, n in kinds if n]
    return sorted(out)


if __name__ == "__main__":
    kind, target = sys.argv[1], Path(sys.argv[2])
    reference = build_openvino(target) if kind == "openvino" else build_coreml(target)
    (target / "reference.json").write_text(json.dumps(reference))
