"""ONNX reader: models written by torch.onnx.export and onnx read back as onnx.load reads them; hostile ones.

The reference is ``onnx.load(..., load_external_data=False)``: names, data types and
dims of every weight (``onnx_reference.onnx_weights``; Constant nodes, functions and
deeper nests are in tests/test_onnx_weights.py).  External data
written by ``onnx.save(save_as_external_data=True)`` is placed in its own file and
checked by ``external_data_findings`` against real sizes.  Hostile protobuf is
hand-made: lengths past the end, 11-byte varints, subgraphs nested 10,000 deep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fuzz_inputs import assert_refused, assert_well_behaved, bounded_scan
from onnx_reference import len_field as _len_field, onnx_weights, varint as _varint

from guard.readers import scan_file
from guard.readers.onnx.graph import external_data_findings
from guard.sources import BytesSource, LocalFile

np = pytest.importorskip("numpy")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _scan(path: Path, name: str | None = None):  # noqa: ANN202
    with LocalFile(path, name=name or path.name) as source:
        return scan_file(source)


def reference(model: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {name: (code, shape) for name, code, shape in onnx_weights(model)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny module through torch.onnx.export (the dynamo exporter, onnxscript)."""
    torch = pytest.importorskip("torch")

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 8)
            self.proj = torch.nn.Linear(8, 4)
            self.norm = torch.nn.LayerNorm(4)

        def forward(self, ids: Any) -> Any:
            return self.norm(self.proj(self.embed(ids)))

    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    torch.onnx.export(Tiny().eval(), (torch.zeros(1, 3, dtype=torch.long),), str(path), dynamo=True,
                      verbose=False)
    return path


@pytest.fixture(scope="module")
def inline(exported: Path) -> Path:
    """The exported model with its weights inline (onnx.save without external data)."""
    from onnx.external_data_helper import convert_model_from_external_data

    model = onnx.load(str(exported))
    convert_model_from_external_data(model)
    path = exported.parent / "inline" / "model.onnx"
    path.parent.mkdir(exist_ok=True)
    onnx.save(model, str(path))
    return path


@pytest.mark.slow
def test_torch_onnx_export_reads_back_what_onnx_load_reports(exported: Path) -> None:
    """torch 2.13's exporter writes the weights beside the graph, in model.onnx.data."""
    scan = _scan(exported)
    assert scan.format == "onnx" and scan.findings == () and scan.companions == ("model.onnx.data",)
    model = onnx.load(str(exported), load_external_data=False)
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == reference(model)
    files = {"model.onnx.data": (exported.parent / "model.onnx.data").read_bytes(),
             "model.onnx": exported.read_bytes()}
    loaded = {t.name: numpy_helper.to_array(t, str(exported.parent)) for t in model.graph.initializer}
    assert {t.file for t in scan.tensors} == set(files)  # small tensors stay inline
    for tensor in scan.tensors:
        assert files[tensor.file][tensor.data_start:tensor.data_end] == loaded[tensor.name].tobytes()
    data = files["model.onnx.data"]
    assert external_data_findings(scan, {"model.onnx.data": len(data)}) == []
    assert scan.metadata["onnx.inputs"] == "ids:I64" and scan.metadata["onnx.output_dtypes"] == "F32"
    assert scan.metadata["onnx.producer"] == "pytorch"
    assert "ai.onnx:" in scan.metadata["onnx.opset"]


@pytest.mark.slow
def test_inline_weights_are_located_in_the_model_file(inline: Path) -> None:
    scan = _scan(inline)
    assert scan.findings == () and scan.companions == ()
    model = onnx.load(str(inline))
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == reference(model)
    raw = inline.read_bytes()
    for tensor in scan.tensors:
        proto = next(t for t in model.graph.initializer if t.name == tensor.name)
        assert tensor.file == "model.onnx" and raw[tensor.data_start:tensor.data_end] == proto.raw_data
    assert scan.bytes_read < len(raw) + 64 * 1024


@pytest.mark.slow
def test_external_data_is_its_own_file_and_is_checked(inline: Path, tmp_path: Path) -> None:
    model = onnx.load(str(inline))
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx_data", size_threshold=0)
    scan = _scan(folder / "model.onnx", "m/model.onnx")
    assert scan.findings == () and scan.companions == ("model.onnx_data",)
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == reference(
        onnx.load(str(folder / "model.onnx"), load_external_data=False))
    data = (folder / "model.onnx_data").read_bytes()
    for tensor in scan.tensors:
        assert tensor.file == "m/model.onnx_data"
        assert data[tensor.data_start:tensor.data_end] == arrays[tensor.name].tobytes()
    size = len(data)
    assert external_data_findings(scan, {"model.onnx_data": size}) == []
    missing = external_data_findings(scan, {"model.onnx_data": None})
    short = external_data_findings(scan, {"model.onnx_data": size - 1})
    assert [f.code for f in missing + short] == ["CG004", "CG004"]
    assert "missing" in missing[0].message and "past the end" in short[0].message


def _if_model() -> Any:
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    branches = [helper.make_graph([helper.make_node("Identity", [f"{n}_c"], ["y"])], n, [], [out],
                                  [numpy_helper.from_array(np.full(2, i, np.float32), f"{n}_c")])
                for i, n in enumerate(("then", "else"))]
    node = helper.make_node("If", ["cond"], ["y"], then_branch=branches[0], else_branch=branches[1])
    typed = [helper.make_tensor("half", TensorProto.FLOAT16, [2], np.ones(2, np.float16).view(np.uint16)),
             helper.make_tensor("ids", TensorProto.INT64, [3], [1, -2, 3]),
             helper.make_tensor("words", TensorProto.STRING, [1], [b"x"])]
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.ones(2, np.float32), "sp"),
                                       numpy_helper.from_array(np.array([0, 3], np.int64), "sp_i"), [4])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [out], typed, sparse_initializer=[sparse])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_subgraph_sparse_and_typed_initializers() -> None:
    model = _if_model()
    scan = scan_file(BytesSource(model.SerializeToString(), name="model.onnx"))
    assert scan.findings == ()
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == reference(model) == {
        "half": ("F16", (2,)), "ids": ("I64", (3,)), "words": ("STRING", (1,)), "sp": ("F32", (4,)),
        "then_c": ("F32", (2,)), "else_c": ("F32", (2,))}


@pytest.mark.slow
def test_fp16_conversion_with_fp32_io_is_visible_in_the_metadata(inline: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(inline)), keep_io_types=True)
    scan = scan_file(BytesSource(model.SerializeToString(), name="model_fp16.onnx"))
    floats = {t.dtype for t in scan.tensors if t.dtype.startswith(("F", "BF"))}
    assert floats == {"F16"}
    assert scan.metadata["onnx.output_dtypes"] == "F32" and scan.metadata["onnx.input_dtypes"] == "I64"


# ---------------------------------------------------------------- hostile protobuf (hand-made)

def _nested_subgraphs(depth: int) -> bytes:
    graph = b""
    for _ in range(depth):  # graph { node { attribute { g: graph } } }
        attribute = _len_field(1, b"then_branch") + _len_field(6, graph)
        graph = _len_field(1, _len_field(5, attribute))
    return _len_field(7, graph)


def _tensor(raw: bytes, dims: tuple[int, ...] = (2,), data_type: int = 1, name: bytes = b"w") -> bytes:
    return b"".join(_varint(1 << 3) + _varint(d) for d in dims) + _varint(2 << 3) + _varint(data_type) + \
        _len_field(8, name) + _len_field(9, raw)


def _model_with(tensor: bytes) -> bytes:
    return _varint(1 << 3) + _varint(9) + _len_field(7, _len_field(5, tensor))


def _external(location: bytes) -> bytes:
    entry = _len_field(1, b"location") + _len_field(2, location)
    tensor = _varint(1 << 3) + _varint(4) + _varint(2 << 3) + _varint(1) + _len_field(8, b"w") + \
        _len_field(13, entry) + _varint(14 << 3) + _varint(1)
    return _model_with(tensor)


HOSTILE = {
    "length-past-the-end": (lambda: _varint(7 << 3 | 2) + _varint(2**40) + b"\0" * 10, "length"),
    "varint-of-11-bytes": (lambda: _varint(1 << 3) + b"\xff" * 10 + b"\x01", "10 bytes"),
    "tag-varint-of-11-bytes": (lambda: b"\x80" * 10 + b"\x01", "10 bytes"),
    "subgraphs-10000-deep": (lambda: _nested_subgraphs(10_000), "deep"),
    "groups-10000-deep": (lambda: _varint(99 << 3 | 3) * 10_000, "deep"),
    "truncated-varint": (lambda: _varint(1 << 3) + b"\xff", "varint"),
    "wire-type-7": (lambda: _varint(5 << 3 | 7), "wire type"),
    "field-number-0": (lambda: _varint(0 << 3 | 0) + b"\0", "tag"),
    "raw-data-too-short": (lambda: _model_with(_tensor(b"\0" * 7)), "raw_data"),
    "dims-overflow": (lambda: _model_with(_tensor(b"", dims=(2**62, 2**62))), "overflow"),
    "negative-dim": (lambda: _model_with(_tensor(b"", dims=(2**64 - 1,))), "non-negative"),
    "no-data-type": (lambda: _model_with(_tensor(b"\0" * 8, data_type=0)), "data type"),
    "external-absolute-path": (lambda: _external(b"/etc/passwd"), "inside the model's folder"),
    "external-climbs-out": (lambda: _external(b"../../secrets.bin"), "inside the model's folder"),
    "external-windows-drive": (lambda: _external(b"C:\\weights.bin"), "inside the model's folder"),
    "packed-dims-cut-varint": (lambda: _model_with(_len_field(1, b"\x80") + _len_field(9, b"")), "varint"),
    "truncated-graph": (lambda: _model_with(_tensor(b"\0" * 8))[:-3], "length"),
    "empty-file": (lambda: b"", "no graph"),
    "only-an-ir-version": (lambda: _varint(1 << 3) + _varint(9), "no graph"),
    # 4 M packed dims: read only to one past the rank limit, never as 4 M Python ints
    "packed-dims-4m": (lambda: _model_with(_len_field(1, b"\x01" * 4_000_000) + _varint(2 << 3) + _varint(1)
                                           + _len_field(9, b"")),
                       "non-negative sizes"),
    "name-of-2-mib": (lambda: _model_with(_tensor(b"\0" * 8, name=b"n" * (2**20 + 1))), "tensor name of"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_protobuf_is_cg001_fast_and_small(case: str) -> None:
    build, contains = HOSTILE[case]
    assert_refused(build(), "model.onnx", contains)


@pytest.mark.parametrize("case", ["subgraphs-10000-deep", "length-past-the-end", "varint-of-11-bytes"])
def test_onnx_load_refuses_the_hostile_files_too(case: str) -> None:
    with pytest.raises(Exception):  # noqa: B017 - any refusal; the point is that it refuses
        onnx.load_model_from_string(HOSTILE[case][0]())


def test_unknown_data_type_is_cg005() -> None:
    data = _model_with(_tensor(b"\0" * 8, data_type=99))
    result = bounded_scan(data, "model.onnx")
    assert_well_behaved(result, data)
    assert [f.code for f in result.scan.findings] == ["CG005"]
    assert [t.dtype for t in result.scan.tensors] == ["onnx:99"]
