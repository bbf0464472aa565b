"""ONNX weights wherever they live: Constant nodes, If/Loop/Scan subgraphs, functions, sparse tensors.

Written with the real tools: both ``torch.onnx`` exporters (TorchScript, ``dynamo=False``,
also over a scripted model with control flow; and ``dynamo=True``), and ``onnx.helper``
for the layouts torch does not write: paddle2onnx's graphs, where every weight is a
Constant node, silero-vad's weights inside If branches, Loop and Scan bodies,
``model.functions``, sparse tensors.  The reference is ``onnx.load(f,
load_external_data=False)`` walked by ``onnx_reference.onnx_weights``.  Hostile
nests are hand-made bytes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from bounds import no_hang
from fuzz_inputs import assert_refused, assert_well_behaved, bounded_scan
from onnx_reference import len_field, onnx_weights, varint
from scanning import codes, json_scan

from guard.readers import scan_file
from guard.sources import BytesSource, LocalFile

np = pytest.importorskip("numpy")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

OPSET = [helper.make_opsetid("", 17)]


def _scan(path: Path) -> Any:
    with LocalFile(path, name=path.name) as source:
        return scan_file(source)


def _inventory(scan: Any) -> Counter[tuple[str, str, tuple[int, ...]]]:
    return Counter((t.name, t.dtype, t.shape) for t in scan.tensors)


def assert_reads_like_onnx_load(path: Path) -> Any:
    """The scan lists exactly the weights onnx.load's protos hold, and numpy_helper can read each."""
    scan = _scan(path)
    assert scan.format == "onnx" and not scan.findings, scan.findings
    model = onnx.load(str(path), load_external_data=False)
    expected = onnx_weights(model, check=lambda t: t.data_location or numpy_helper.to_array(t))
    assert _inventory(scan) == Counter(expected)
    return scan


def _save(model: Any, folder: Path, name: str = "model.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(folder / name))
    return folder / name


def _const(name: str, array: Any, node_name: str = "") -> Any:
    return helper.make_node("Constant", [], [name], name=node_name or None,
                            value=numpy_helper.from_array(array, name=""))


# ---------------------------------------------------------------- paddle2onnx: every weight a Constant

def paddle_style(dtype: Any, *, as_constants: bool = True) -> Any:
    """A conv + fc net as paddle2onnx writes it: weights are Constant nodes named p2o.Constant.N."""
    rng = np.random.default_rng(0)
    weights = {"conv2d_0.w_0": rng.standard_normal((4, 3, 3, 3)), "conv2d_0.b_0": rng.standard_normal(4),
               "linear_0.w_0": rng.standard_normal((4 * 6 * 6, 5)), "linear_0.b_0": rng.standard_normal(5)}
    arrays = {name: value.astype(dtype) for name, value in weights.items()}
    arrays["shape"] = np.array([1, -1], np.int64)
    nodes = [helper.make_node("Conv", ["x", "conv2d_0.w_0", "conv2d_0.b_0"], ["c"], name="p2o.Conv.0"),
             helper.make_node("Relu", ["c"], ["r"], name="p2o.Relu.0"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="p2o.Reshape.0"),
             helper.make_node("MatMul", ["f", "linear_0.w_0"], ["m"], name="p2o.MatMul.0"),
             helper.make_node("Add", ["m", "linear_0.b_0"], ["y"], name="p2o.Add.0")]
    initializers = []
    if as_constants:
        nodes = [_const(name, value, f"p2o.Constant.{i}") for i, (name, value) in enumerate(arrays.items())] + nodes
    else:
        initializers = [numpy_helper.from_array(value, name) for name, value in arrays.items()]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(nodes, "paddle", [helper.make_tensor_value_info("x", elem, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", elem, [1, 5])], initializers)
    return helper.make_model(graph, opset_imports=OPSET, producer_name="PaddlePaddle")


def test_paddle_constant_graph_reads_every_weight(tmp_path: Path) -> None:
    scan = assert_reads_like_onnx_load(_save(paddle_style(np.float32), tmp_path))
    assert {t.name: t.dtype for t in scan.tensors} == {
        "conv2d_0.w_0": "F32", "conv2d_0.b_0": "F32", "linear_0.w_0": "F32", "linear_0.b_0": "F32", "shape": "I64"}
    raw = (tmp_path / "model.onnx").read_bytes()
    weight = next(t for t in scan.tensors if t.name == "linear_0.w_0")  # located, for --values
    assert raw[weight.data_start:weight.data_end] == paddle_style(np.float32).graph.node[2].attribute[0].t.raw_data


def test_paddle_fp16_copy_is_cg101_exactly_like_an_initializer_graph(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verdicts = {}
    for dtype in ("float32", "float16"):
        for layout in ("constants", "initializers"):
            _save(paddle_style(np.dtype(dtype), as_constants=layout == "constants"), tmp_path / f"{dtype}-{layout}")
            rc, report = json_scan(capsys, str(tmp_path / f"{dtype}-{layout}"), "--expect", "fp32")
            (ws,) = report["models"][0]["sets"]
            verdicts[dtype, layout] = (rc, codes(report, severity="error"), ws["parameters"], ws["dtypes"])
    assert verdicts["float32", "constants"] == verdicts["float32", "initializers"]
    assert verdicts["float16", "constants"] == verdicts["float16", "initializers"]
    assert verdicts["float32", "constants"][:3] == (0, set(), 4 * 27 + 4 + 144 * 5 + 5)
    assert verdicts["float16", "constants"][:2] == (1, {"CG101"})


def test_constant_weights_saved_as_external_data(tmp_path: Path) -> None:
    """Constant values in the data file: onnx's external_data_helper moves them with convert_attribute=True."""
    from onnx.external_data_helper import convert_model_to_external_data

    from guard.readers.onnx.graph import external_data_findings

    model = paddle_style(np.float32)
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="model.onnx_data",
                                   size_threshold=64, convert_attribute=True)
    onnx.save(model, str(tmp_path / "model.onnx"))
    scan = assert_reads_like_onnx_load(tmp_path / "model.onnx")
    assert scan.companions == ("model.onnx_data",)
    data = (tmp_path / "model.onnx_data").read_bytes()
    external = {t.name: data[t.data_start:t.data_end] for t in scan.tensors if t.file == "model.onnx_data"}
    assert sorted(external) == ["conv2d_0.w_0", "linear_0.w_0"]
    loaded = onnx.load(str(tmp_path / "model.onnx"))
    values = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in loaded.graph.node
              if n.op_type == "Constant"}
    assert all(external[name] == values[name].tobytes() for name in external)
    assert external_data_findings(scan, {"model.onnx_data": len(data)}) == []
    assert [f.code for f in external_data_findings(scan, {"model.onnx_data": None})] == ["CG004"]


# ---------------------------------------------------------------- torch.onnx, both exporters

@pytest.fixture(scope="module")
def torch_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch = pytest.importorskip("torch")

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 4)
            self.norm = torch.nn.LayerNorm(4)

        def forward(self, x: Any) -> Any:
            return torch.nn.functional.gelu(self.norm(self.proj(x))) * 0.5

    class Branchy(torch.nn.Module):  # scripted: the TorchScript exporter writes an If with subgraphs
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if bool(x.sum() > 0):
                return self.a(x) * 2.0
            return self.b(x) + torch.ones(4)

    root = tmp_path_factory.mktemp("torch-onnx")
    out = {}
    for name, module, dtype, kwargs in (
            ("torchscript", Tiny(), torch.float32, {"dynamo": False}),
            ("torchscript-fp16", Tiny().half(), torch.float16, {"dynamo": False}),
            ("dynamo", Tiny(), torch.float32, {"dynamo": True, "external_data": False}),
            ("scripted-if", torch.jit.script(Branchy()), torch.float32, {"dynamo": False})):
        (root / name).mkdir()
        out[name] = root / name / "model.onnx"
        torch.onnx.export(module.eval(), (torch.ones(1, 8 if name != "scripted-if" else 4, dtype=dtype),),
                          str(out[name]), **kwargs)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["torchscript", "torchscript-fp16", "dynamo", "scripted-if"])
def test_torch_onnx_exports_read_like_onnx_load(torch_exports: dict[str, Path], name: str) -> None:
    scan = assert_reads_like_onnx_load(torch_exports[name])
    floats = {t.dtype for t in scan.tensors if t.dtype.startswith(("F", "BF"))}
    assert floats == {"F16" if name.endswith("fp16") else "F32"}
    if name == "scripted-if":
        model = onnx.load(str(torch_exports[name]))
        assert any(n.op_type == "If" for n in model.graph.node)


@pytest.mark.slow
def test_torch_onnx_fp16_export_is_cg101(torch_exports: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert json_scan(capsys, str(torch_exports["torchscript"].parent))[0] == 0
    rc, report = json_scan(capsys, str(torch_exports["torchscript-fp16"].parent), "--expect", "fp32")
    assert rc == 1 and "CG101" in codes(report)


# ---------------------------------------------------------------- control flow, functions, sparse

def _out(name: str, elem: int = TensorProto.FLOAT, shape: list[int] | None = None) -> Any:
    return helper.make_tensor_value_info(name, elem, shape if shape is not None else [4])


def silero_style(dtype: Any = np.float32) -> Any:
    """silero-vad keeps its weights inside If branches (one per sample rate), here with a nested If."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inner = [helper.make_graph([_const("w", np.full(4, k, dtype)),
                                helper.make_node("Add", ["x", "w"], ["y"])], f"inner_{k}", [], [_out("y", elem)])
             for k in (1, 2)]
    then_g = helper.make_graph([_const("stft/w", np.ones(4, dtype), "stft_const"),
                                helper.make_node("If", ["deep"], ["y"], name="If/inner", then_branch=inner[0],
                                                 else_branch=inner[1])], "sr16k", [], [_out("y", elem)])
    else_g = helper.make_graph([helper.make_node("Identity", ["w8k"], ["y"])], "sr8k", [], [_out("y", elem)],
                               [numpy_helper.from_array(np.zeros(4, dtype), "w8k")])
    node = helper.make_node("If", ["sr16k"], ["y"], name="If_0", then_branch=then_g, else_branch=else_g)
    graph = helper.make_graph([node], "vad", [_out("sr16k", TensorProto.BOOL, []), _out("deep", TensorProto.BOOL, []),
                                              _out("x", elem)], [_out("y", elem)])
    return helper.make_model(graph, opset_imports=OPSET)


def test_weights_in_if_branches_are_read_with_their_path(tmp_path: Path) -> None:
    scan = assert_reads_like_onnx_load(_save(silero_style(), tmp_path))
    assert sorted(t.name for t in scan.tensors) == [
        "If_0/then_branch/If%2Finner/else_branch/w", "If_0/then_branch/If%2Finner/then_branch/w",
        "If_0/then_branch/stft%2Fw", "w8k"]


def test_fp16_weights_in_branches_are_cg101(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _save(silero_style(np.float32), tmp_path / "fp32")
    _save(silero_style(np.float16), tmp_path / "fp16")
    assert json_scan(capsys, str(tmp_path / "fp32"))[0] == 0
    rc, report = json_scan(capsys, str(tmp_path / "fp16"), "--expect", "fp32")
    assert rc == 1 and codes(report, severity="error") == {"CG101"}


def loop_and_scan() -> Any:
    body_in = [_out("i", TensorProto.INT64, []), _out("cond", TensorProto.BOOL, []), _out("acc")]
    loop_body = helper.make_graph([_const("step", np.full(4, 0.5, np.float32)),
                                   helper.make_node("Identity", ["cond"], ["cond_out"]),
                                   helper.make_node("Add", ["acc", "step"], ["acc_out"])], "loop_body", body_in,
                                  [_out("cond_out", TensorProto.BOOL, []), _out("acc_out")])
    scan_body = helper.make_graph([_const("k", np.ones(4, np.float32)),
                                   helper.make_node("Mul", ["s", "k"], ["s_out"])], "scan_body",
                                  [_out("s")], [_out("s_out")])
    nodes = [helper.make_node("Loop", ["n", "c", "x"], ["looped"], body=loop_body),
             helper.make_node("Scan", ["xs"], ["ys"], body=scan_body, num_scan_inputs=1)]
    graph = helper.make_graph(nodes, "g", [_out("n", TensorProto.INT64, []), _out("c", TensorProto.BOOL, []),
                                           _out("x"), _out("xs", shape=[3, 4])],
                              [_out("looped"), _out("ys", shape=[3, 4])])
    return helper.make_model(graph, opset_imports=OPSET)


def test_loop_and_scan_bodies(tmp_path: Path) -> None:
    scan = assert_reads_like_onnx_load(_save(loop_and_scan(), tmp_path))
    assert {t.name: t.dtype for t in scan.tensors} == {"Loop#0/body/step": "F32", "Scan#1/body/k": "F32"}


def with_function() -> Any:
    body = [_const("w", np.ones((4, 4), np.float16), "fw"),
            helper.make_node("MatMul", ["x", "w"], ["y"])]
    function = helper.make_function("custom", "Dense", ["x"], ["y"], body, OPSET)
    graph = helper.make_graph([helper.make_node("Dense", ["x"], ["y"], domain="custom")], "g",
                              [_out("x", TensorProto.FLOAT16, [1, 4])], [_out("y", TensorProto.FLOAT16, [1, 4])])
    return helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("custom", 1)], functions=[function])


def test_function_bodies_hold_weights_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scan = assert_reads_like_onnx_load(_save(with_function(), tmp_path))
    assert [(t.name, t.dtype) for t in scan.tensors] == [("functions/custom.Dense/w", "F16")]
    rc, report = json_scan(capsys, str(tmp_path), "--expect", "fp32")
    assert rc == 1 and codes(report, severity="error") == {"CG101"}


def odd_constants() -> Any:
    """Every Constant value attribute, a sparse one, a sparse initializer, names that collide."""
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.ones(2, np.float32), ""),
                                       numpy_helper.from_array(np.array([0, 5], np.int64), ""), [2, 3])
    nodes = [helper.make_node("Constant", [], ["eps"], value_float=1e-5),
             helper.make_node("Constant", [], ["scales"], value_floats=[0.5, 2.0, 4.0]),
             helper.make_node("Constant", [], ["axis"], value_int=1),
             helper.make_node("Constant", [], ["perm"], value_ints=[1, 0]),
             helper.make_node("Constant", [], ["label"], value_string="x"),
             helper.make_node("Constant", [], ["sp"], sparse_value=sparse),
             helper.make_node("Constant", [], [""], name="unnamed_out", value=numpy_helper.from_array(
                 np.zeros(2, np.float32))),
             helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(np.ones(3, np.float32))),
             helper.make_node("ConstantOfShape", ["perm"], ["filled"],  # a tensor in an attribute: counted
                              value=numpy_helper.from_array(np.ones(1, np.float32)))]
    initializer = numpy_helper.from_array(np.ones(2, np.float32), "w")  # an SSA violation onnx.load accepts
    graph = helper.make_graph(nodes, "g", [], [_out("filled", shape=[2, 1])], [initializer],
                              sparse_initializer=[helper.make_sparse_tensor(
                                  numpy_helper.from_array(np.ones(1, np.float16), "si"),
                                  numpy_helper.from_array(np.array([3], np.int64), ""), [8])])
    return helper.make_model(graph, opset_imports=OPSET)


def test_every_constant_attribute_and_sparse_tensors() -> None:
    model = odd_constants()
    scan = scan_file(BytesSource(model.SerializeToString(), name="model.onnx"))
    assert not scan.findings
    assert _inventory(scan) == Counter(onnx_weights(model))
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == {
        "eps": ("F32", ()), "scales": ("F32", (3,)), "axis": ("I64", ()), "perm": ("I64", (2,)),
        "label": ("STRING", ()), "sp": ("F32", (2, 3)), "unnamed_out": ("F32", (2,)), "w": ("F32", (2,)),
        "w#2": ("F32", (3,)), "si": ("F16", (8,)), "ConstantOfShape#8/value": ("F32", (1,))}


# ---------------------------------------------------------------- tensors in attributes of any node (issue 22)

def attribute_tensors_graph(dtype: Any = np.float32) -> Any:
    """Tensors in attributes of nodes that are not Constants: ConstantOfShape's ``value`` (where onnx's own
    "light" backend models keep weights), a custom operator's tensor, tensor list and sparse tensor,
    and a ConstantOfShape inside an If branch."""
    value = numpy_helper.from_array(np.full([1], 0.25, dtype), "")
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.ones(2, dtype), ""),
                                       numpy_helper.from_array(np.array([1, 4], np.int64), ""), [3, 2])
    custom = helper.make_node("Pack", ["filled"], ["packed"], name="pack/0", domain="custom.ops",
                              table=numpy_helper.from_array(np.arange(6, dtype=dtype).reshape(2, 3), ""),
                              banks=[numpy_helper.from_array(np.ones(k + 1, dtype), "") for k in range(2)],
                              mask=sparse)
    branch = helper.make_graph([helper.make_node("ConstantOfShape", ["dims"], ["y"], name="fill", value=value)],
                               "then", [], [_out("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [2])])
    empty = helper.make_graph([helper.make_node("Identity", ["packed"], ["y"])], "else", [],
                              [_out("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [2])])
    nodes = [helper.make_node("ConstantOfShape", ["dims"], ["filled"], value=value), custom,
             helper.make_node("If", ["cond"], ["out"], name="If_0", then_branch=branch, else_branch=empty)]
    graph = helper.make_graph(nodes, "g", [_out("dims", TensorProto.INT64, [1]), _out("cond", TensorProto.BOOL, [])],
                              [_out("out", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [2])])
    return helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("custom.ops", 1)])


def test_tensors_in_attributes_of_any_node_are_weights(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(attribute_tensors_graph(), str(folder / "model.onnx"))  # a custom operator: no checker for it
    scan = assert_reads_like_onnx_load(folder / "model.onnx")
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == {
        "ConstantOfShape#0/value": ("F32", (1,)), "pack%2F0/table": ("F32", (2, 3)),
        "pack%2F0/banks[0]": ("F32", (1,)), "pack%2F0/banks[1]": ("F32", (2,)), "pack%2F0/mask": ("F32", (3, 2)),
        "If_0/then_branch/fill/value": ("F32", (1,))}
    raw = (folder / "model.onnx").read_bytes()  # located in the file, for --values
    table = next(t for t in scan.tensors if t.name == "pack%2F0/table")
    assert np.frombuffer(raw[table.data_start:table.data_end], np.float32).tolist() == [0, 1, 2, 3, 4, 5]


def test_fp16_tensors_in_attributes_are_judged_like_initializers(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for dtype in ("float32", "float16"):
        (tmp_path / dtype).mkdir()
        onnx.save(attribute_tensors_graph(np.dtype(dtype)), str(tmp_path / dtype / "model.onnx"))
    assert json_scan(capsys, str(tmp_path / "float32"), "--expect", "fp32")[0] == 0
    rc, report = json_scan(capsys, str(tmp_path / "float16"), "--expect", "fp32")
    assert rc == 1 and codes(report, severity="error") == {"CG101"}


def test_attribute_tensors_in_external_data(tmp_path: Path) -> None:
    """onnx's external_data_helper moves attribute tensors too (convert_attribute=True): placed in the data file."""
    from onnx.external_data_helper import convert_model_to_external_data

    model = attribute_tensors_graph()
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="model.onnx_data",
                                   size_threshold=0, convert_attribute=True)
    onnx.save(model, str(tmp_path / "model.onnx"))
    scan = assert_reads_like_onnx_load(tmp_path / "model.onnx")
    assert scan.companions == ("model.onnx_data",)
    external = {t.name for t in scan.tensors if t.file == "model.onnx_data"}
    assert external >= {"pack%2F0/table", "ConstantOfShape#0/value"}


def _backend_models() -> list[Path]:
    root = Path(onnx.__file__).parent / "backend" / "test" / "data"
    return sorted(root.rglob("*.onnx"))


def test_onnx_backend_test_models_read_like_onnx_load() -> None:
    """Every model of onnx's own backend test data: the scan lists what the reference walk of onnx.load lists.
    Its "light" models keep weights as ConstantOfShape values: those must count (9 disagreed before)."""
    models = _backend_models()
    if not models:
        pytest.skip("this onnx wheel ships no backend test data")
    disagree, with_attribute_tensors = [], 0
    for path in models:
        with LocalFile(path, name=path.name) as source:
            scan = scan_file(source)
        expected = Counter(onnx_weights(onnx.load(str(path), load_external_data=False)))
        if scan.format != "onnx" or _inventory(scan) != expected:
            disagree.append(path.name)
        with_attribute_tensors += any("/" in t.name for t in scan.tensors)
    assert not disagree, disagree
    assert with_attribute_tensors >= 9


def test_constant_weights_are_read_in_place_not_downloaded() -> None:
    """A Hub scan reads the graph through ranged reads: a 4 MB Constant's bytes are skipped, not fetched."""
    big = helper.make_graph([_const("big", np.ones((1024, 1024), np.float32))], "g", [],
                            [_out("big", shape=[1024, 1024])])
    data = helper.make_model(big, opset_imports=OPSET).SerializeToString()
    scan = scan_file(BytesSource(data, name="model.onnx"))
    assert [(t.name, t.data_end - t.data_start) for t in scan.tensors] == [("big", 4 * 2**20)]
    assert scan.bytes_read < 200_000


# ---------------------------------------------------------------- hostile nests (hand-made)

def _constant_node(output: bytes) -> bytes:
    tensor = varint(1 << 3) + varint(2) + varint(2 << 3) + varint(1) + len_field(9, b"\0" * 8)
    attribute = len_field(1, b"value") + len_field(5, tensor) + varint(20 << 3) + varint(4)
    return len_field(1, len_field(2, output) + len_field(4, b"Constant") + len_field(5, attribute))


def nested(depth: int, field: int) -> bytes:
    """``depth`` subgraphs each in the last, through GRAPH (6, If/Loop) or GRAPHS (11) attributes,
    a Constant node at every level."""
    graph = _constant_node(b"c")
    for _ in range(depth):
        attribute = len_field(1, b"body") + len_field(field, graph)
        graph = _constant_node(b"c") + len_field(1, len_field(4, b"Loop") + len_field(5, attribute))
    return len_field(7, graph)


@pytest.mark.parametrize("field", [6, 11], ids=["graph", "graphs"])
def test_constants_nested_10000_subgraphs_deep_are_cg001(field: int) -> None:
    assert_refused(nested(10_000, field), "model.onnx", "deep")
    with pytest.raises(Exception):  # noqa: B017 - onnx.load refuses it too
        onnx.load_model_from_string(nested(10_000, field))


@pytest.mark.parametrize("field", [6, 11], ids=["graph", "graphs"])
def test_constants_nested_as_deep_as_protobuf_parses_are_all_read(field: int) -> None:
    data = nested(32, field)  # 32 levels of graph > node > attribute: 97 messages deep, protobuf's limit 100
    scan = scan_file(BytesSource(data, name="model.onnx"))
    assert not scan.findings and len(scan.tensors) == 33
    assert _inventory(scan) == Counter(onnx_weights(onnx.load_model_from_string(data)))
    part = "body/" if field == 6 else "body[0]/"
    assert max((t.name for t in scan.tensors), key=len) == "Loop#1/" + ("Loop#1/".join([part] * 32)) + "c"


def test_many_constants_of_one_name_are_named_in_linear_time() -> None:
    """20,000 Constants all named 'c' (an SSA violation onnx.load accepts): c, c#2, ... c#20000.
    A search from #2 for each would be 200 M lookups, which the alarm ends; memory is that of
    the tensors listed (below: a few hundred bytes each, nothing kept per node beyond them)."""
    data = len_field(7, _constant_node(b"c") * 20_000)
    with no_hang():
        scan = scan_file(BytesSource(data, name="model.onnx"))
    names = [t.name for t in scan.tensors]
    assert len(set(names)) == 20_000 and names[:3] == ["c", "c#2", "c#3"] and names[-1] == "c#20000"
    small = len_field(7, _constant_node(b"c") * 2_000)
    result = bounded_scan(small, "model.onnx")
    assert_well_behaved(result, small)
    assert result.peak_bytes < 1000 * 2_000


# ---------------------------------------------------------------- through the Hub (ranged reads)

@pytest.mark.slow
def test_constant_graphs_through_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hub scan`` of paddle-style and If graphs: the local verdict, from ranged reads of the graph."""
    pytest.importorskip("huggingface_hub")
    from hub_standin import standin_fixture
    from test_hub_scan import finding_keys, local_and_remote

    model = tmp_path / "model"
    big = helper.make_graph([_const("fc.w", np.ones((1024, 1024), np.float16))], "g", [],
                            [_out("fc.w", TensorProto.FLOAT16, [1024, 1024])])
    _save(helper.make_model(big, opset_imports=OPSET), model / "paddle")
    _save(silero_style(np.float16), model / "vad")
    for standin in standin_fixture(monkeypatch, tmp_path / "hub"):
        rc_local, local, rc_remote, remote = local_and_remote(standin, model, "org/model", monkeypatch)
        assert rc_local == rc_remote == 1
        assert finding_keys(remote, "org/model") == finding_keys(local, "model")
        assert {f["code"] for f in local["findings"]} == {"CG101"}
        assert [m["dtypes"] for m in remote["models"]] == [m["dtypes"] for m in local["models"]]
        stats = {f["path"]: f for f in remote["extra"]["hub"]["repos"][0]["files"]}
        paddle = stats["paddle/model.onnx"]
        # as for inline initializers (tests/test_hub_formats.py): two, and one read after each large payload
        assert paddle["requests"] <= 2 + 1
        assert paddle["bytes"] < (model / "paddle" / "model.onnx").stat().st_size / 10
