"""Rules on GGUF / ONNX / NumPy files through `ckpt-guard scan`: the verdict an expert gives, then defects.

Every file is written by its real library (GGUFWriter, onnx and onnxruntime's fp16
converter, numpy); each model sits in its own folder.  The expert's verdicts:
an F16 GGUF with F32 norms is one dtype; a Q8_0 GGUF is quantized, not mixed; an
fp16 ONNX whose graph inputs and outputs stay fp32 is fine under --expect fp16.
Planted: a file_type that the tensors contradict (CG103), names that claim
another dtype (CG108), bf16 for ONNX Runtime's CPU provider (CG106),
truncations (CG001), bf16 lost in an .npy (CG005).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from guard.cli import main
from guard.rules.formats import NAME_DTYPES, name_claimed_dtype

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")
onnx = pytest.importorskip("onnx")
ml_dtypes = pytest.importorskip("ml_dtypes")
from gguf import GGMLQuantizationType, GGUFWriter  # noqa: E402
from gguf.quants import quantize  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def write_gguf(path: Path, *, file_type: int, weights: str) -> Path:
    """A two-layer llama-like file: 2-D weights in ``weights``, 1-D norms in F32 as llama.cpp keeps them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    writer = GGUFWriter(path, "llama")
    writer.add_file_type(file_type)
    writer.add_quantization_version(2)
    for i in range(2):
        w = rng.standard_normal((8, 64)).astype(np.float32)
        name = f"blk.{i}.ffn_up.weight"
        if weights == "Q8_0":
            q = quantize(w, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        elif weights == "BF16":
            b = w.astype(ml_dtypes.bfloat16).view(np.uint8)
            writer.add_tensor(name, b, raw_shape=b.shape, raw_dtype=GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(name, w.astype(np.float16 if weights == "F16" else np.float32))
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_onnx(path: Path, dtype: Any) -> Path:
    """A two-layer MLP written by onnx; floats in ``dtype`` throughout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(np.ones((4, 4), dtype), "fc1.weight"),
             numpy_helper.from_array(np.ones((4, 2), dtype), "fc2.weight")]
    nodes = [helper.make_node("MatMul", ["x", "fc1.weight"], ["h"]),
             helper.make_node("MatMul", ["h", "fc2.weight"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", elem, [1, 4])],
                              [helper.make_tensor_value_info("y", elem, [1, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["scan", "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def codes(report: dict) -> list[str]:
    return sorted({f["code"] for f in report["findings"]})


# ---------------------------------------------------------------- the expert's verdicts

def test_f16_gguf_with_f32_norms_is_one_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_gguf(tmp_path / "m" / "tiny-f16.gguf", file_type=1, weights="F16")
    code, report = scan(capsys, str(tmp_path / "m"), "--expect", "fp16")
    assert code == 0 and report["findings"] == []
    assert report["models"][0]["dtypes"]["F16"]["parameters"] == 2 * 8 * 64
    code, report = scan(capsys, str(tmp_path / "m"), "--expect", "uniform")
    assert code == 0 and report["findings"] == []


def test_q8_0_gguf_is_quantized_not_mixed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_gguf(tmp_path / "m" / "tiny-q8_0.gguf", file_type=7, weights="Q8_0")
    code, report = scan(capsys, str(tmp_path / "m"))
    assert code == 0 and report["findings"] == []
    (model,) = report["models"]
    assert model["quantization"]["method"] == "gguf" and model["quantization"]["format"] == "Q8_0"
    assert model["dtypes"]["Q8_0"] == {"tensors": 2, "parameters": 1024, "bytes": 2 * 16 * 34}


@pytest.mark.slow
def test_fp16_onnx_with_fp32_io_is_fine_under_expect_fp16(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    fp32 = write_onnx(tmp_path / "src" / "model.onnx", np.float32)
    model = convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True)
    (tmp_path / "m").mkdir()
    onnx.save(model, str(tmp_path / "m" / "model_fp16.onnx"))
    code, report = scan(capsys, str(tmp_path / "m"), "--expect", "fp16")
    assert code == 0 and report["findings"] == []
    notes = report["models"][0]["sets"][0]["notes"]  # the summary shows keep_io_types was used
    assert "graph inputs F32" in notes and "graph outputs F32" in notes
    code, report = scan(capsys, str(tmp_path / "src"))
    assert code == 0 and report["findings"] == []


def test_numpy_weights_read_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    np.save(tmp_path / "m" / "embeddings.npy", np.ones((4, 3), np.float32))
    np.savez_compressed(tmp_path / "m" / "head.npz", w=np.ones((3, 2), np.float32), b=np.zeros(2, np.float32))
    code, report = scan(capsys, str(tmp_path / "m"))
    assert code == 0 and report["findings"] == []
    sets = {ws["name"]: ws for ws in report["models"][0]["sets"]}  # two loose files: two weight sets
    assert sets["embeddings.npy"]["dtypes"] == {"F32": {"tensors": 1, "parameters": 12, "bytes": 48}}
    assert sets["head.npz"]["dtypes"] == {"F32": {"tensors": 2, "parameters": 8, "bytes": 32}}


# ---------------------------------------------------------------- planted defects

def test_gguf_file_type_contradicted_by_its_tensors_is_cg103(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    write_gguf(tmp_path / "a" / "tiny.gguf", file_type=1, weights="BF16")  # MOSTLY_F16 holding BF16
    write_gguf(tmp_path / "b" / "tiny.gguf", file_type=7, weights="F32")  # MOSTLY_Q8_0 holding F32
    code, report = scan(capsys, str(tmp_path), "--expect", "uniform")
    found = {(f["code"], f["path"].split("/")[-2]) for f in report["findings"]}
    assert found == {("CG103", "a"), ("CG103", "b")}, report["findings"]
    messages = sorted(f["message"] for f in report["findings"])
    assert "MOSTLY_F16" in messages[0] and "bf16" in messages[0]
    assert "MOSTLY_Q8_0" in messages[1] and "fp32" in messages[1]
    assert code == 0  # CG103 is a warning
    assert main(["scan", str(tmp_path), "--expect", "uniform", "--fail-on", "warning"]) == 1


def test_names_that_claim_another_dtype_are_cg108(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_onnx(tmp_path / "onnx" / "model_fp16.onnx", np.float32)
    write_gguf(tmp_path / "gguf" / "tiny-bf16.gguf", file_type=1, weights="F16")
    from safetensors.numpy import save_file

    (tmp_path / "st").mkdir()
    save_file({"w": np.ones((2, 2), np.float32)}, tmp_path / "st" / "model.f16.safetensors")
    code, report = scan(capsys, str(tmp_path), "--expect", "uniform")
    cg108 = sorted(Path(f["path"]).name for f in report["findings"] if f["code"] == "CG108")
    assert cg108 == ["model.f16.safetensors", "model_fp16.onnx", "tiny-bf16.gguf"], report["findings"]
    assert code == 1


def test_bf16_onnx_is_cg106_for_onnx_runtime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_onnx(tmp_path / "m" / "model.onnx", ml_dtypes.bfloat16)
    code, report = scan(capsys, str(tmp_path / "m"), "--expect", "bf16")
    assert codes(report) == ["CG106"]
    assert "onnxruntime" in report["findings"][0]["message"]


@pytest.mark.slow
def test_onnx_runtime_really_has_no_cpu_bf16_matmul(tmp_path: Path) -> None:
    """The fact behind CG106's onnxruntime entry (docs/formats.md), checked on the installed runtime."""
    ort = pytest.importorskip("onnxruntime")
    path = write_onnx(tmp_path / "model.onnx", ml_dtypes.bfloat16)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fp16 = write_onnx(tmp_path / "fp16.onnx", np.float16)
    session = ort.InferenceSession(str(fp16), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((1, 4), np.float16)})[0].shape == (1, 2)
    # float8 and int4 weights are fine where a quantized model puts them: before DequantizeLinear
    for dtype, opset in ((ml_dtypes.float8_e4m3fn, 19), (ml_dtypes.int4, 21)):
        graph = helper.make_graph(
            [helper.make_node("DequantizeLinear", ["w", "s"], ["d"]), helper.make_node("MatMul", ["x", "d"], ["y"])],
            "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
            [numpy_helper.from_array(np.ones((2, 2), dtype), "w"),
             numpy_helper.from_array(np.array(0.5, np.float32), "s")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 10
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        assert session.run(None, {"x": np.ones((1, 2), np.float32)})[0].tolist() == [[1.0, 1.0]]


def test_truncated_files_are_cg001(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "m"
    gguf_path = write_gguf(folder / "tiny.gguf", file_type=1, weights="F16")
    onnx_path = write_onnx(folder / "model.onnx", np.float32)
    np.save(folder / "w.npy", np.ones((64, 64), np.float32))
    for path in (gguf_path, onnx_path, folder / "w.npy"):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
    code, report = scan(capsys, str(folder))
    assert code == 1
    assert sorted(Path(f["path"]).name for f in report["findings"] if f["code"] == "CG001") == [
        "model.onnx", "tiny.gguf", "w.npy"]


def test_bf16_through_an_npy_is_cg005(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    np.save(tmp_path / "m" / "w.npy", np.ones(3, ml_dtypes.bfloat16))
    code, report = scan(capsys, str(tmp_path / "m"))
    assert codes(report) == ["CG005"] and "bfloat16" in report["findings"][0]["message"]


def test_scanning_these_formats_stays_light(tmp_path: Path) -> None:
    write_gguf(tmp_path / "a" / "tiny.gguf", file_type=1, weights="F16")
    write_onnx(tmp_path / "b" / "model.onnx", np.float32)
    (tmp_path / "c").mkdir()
    np.save(tmp_path / "c" / "w.npy", np.ones(2))
    np.savez(tmp_path / "c" / "z.npz", a=np.ones(2))
    code = ("import sys\nfrom guard.cli import main\n"
            "main(['scan', sys.argv[1], '--format', 'json', '-o', sys.argv[2]])\n"
            "print([m for m in ('numpy', 'onnx', 'gguf', 'google.protobuf', 'torch', 'ml_dtypes') "
            "if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(tmp_path / "r.json")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    report = json.loads((tmp_path / "r.json").read_text())
    assert {f["format"] for m in report["models"] for f in m["files"]} == {"gguf", "onnx", "npy", "npz"}


# ---------------------------------------------------------------- the name table

@pytest.mark.parametrize("name, claim", [
    ("model_fp16.onnx", "F16"), ("model_q4f16.onnx", "F16"), ("model.onnx", None), ("model_q4.onnx", None),
    ("Llama-3.2-1B-Instruct-f16.gguf", "F16"), ("gemma-2b-it-bf16-00001-of-00002.gguf", "BF16"),
    ("ggml-model-f32.gguf", "F32"), ("tiny-Q4_K_M.gguf", None),
    ("model.fp16.safetensors", "F16"), ("diffusion_pytorch_model.fp16-00001-of-00002.safetensors", "F16"),
    ("unet/diffusion_pytorch_model.bf16.bin", "BF16"), ("model.safetensors", None),
    ("embeddings_float32.npy", "F32"), ("half.npy", None), ("x-fp16-to-bf16.safetensors", None),
])
def test_name_claimed_dtype(name: str, claim: str | None) -> None:
    assert name_claimed_dtype(name) == claim


def test_name_table_spells_only_float_codes() -> None:
    assert set(NAME_DTYPES.values()) <= {"F16", "BF16", "F32", "F64"}
