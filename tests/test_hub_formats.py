"""`ckpt-guard hub scan` of GGUF, ONNX and NumPy files through the stand-in Hub (real huggingface_hub client).

Targets (issue 13): a GGUF or ONNX file whose header fits in 1 MiB costs at most 2
ranged requests and under 1 % of its bytes; the remote findings are the local ones.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")
onnx = pytest.importorskip("onnx")

from hub_standin import StandinHub, standin_fixture  # noqa: E402
from test_hub_scan import run_json  # noqa: E402

MB = 1024 * 1024


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def gguf_bytes(tmp_path: Path, *, vocabulary: int = 0, layers: int = 4) -> bytes:
    path = tmp_path / f"m-{vocabulary}.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_file_type(1)
    if vocabulary:
        writer.add_array("tokenizer.ggml.tokens", [f"token-{i:06d}" for i in range(vocabulary)])
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((1024, 1024), np.float16))  # 2 MiB each
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(1024, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def onnx_files(tmp_path: Path) -> dict[str, bytes]:
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.zeros((1024, 1024), np.float32), f"fc{i}.weight") for i in range(4)]
    nodes = [helper.make_node("MatMul", [f"h{i}", f"fc{i}.weight"], [f"h{i + 1}"]) for i in range(4)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 1024])],
                              [helper.make_tensor_value_info("h4", TensorProto.FLOAT, [1, 1024])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inline = model.SerializeToString()
    onnx.save(model, str(tmp_path / "model.onnx"), save_as_external_data=True, location="model.onnx_data")
    return {"onnx/model.onnx": (tmp_path / "model.onnx").read_bytes(),
            "onnx/model.onnx_data": (tmp_path / "model.onnx_data").read_bytes(),
            "onnx-inline/model.onnx": inline}


@pytest.mark.slow
def test_gguf_onnx_and_numpy_through_the_hub(standin: StandinHub, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"gguf/model-f16.gguf": gguf_bytes(tmp_path),
             "gguf-vocab/model-f16.gguf": gguf_bytes(tmp_path, vocabulary=40_000),  # ~900 KiB header
             **onnx_files(tmp_path)}
    buf = io.BytesIO()
    np.savez(buf, **{f"layer{i}": np.zeros((512, 1024), np.float32) for i in range(4)})
    files["numpy/weights.npz"] = buf.getvalue()
    standin.add_repo("org/formats", files)
    rc, report = run_json(["hub", "scan", "org/formats", "--expect", "uniform"], tmp_path / "r.json")
    assert rc == 0, report["findings"]
    stats = {f["path"]: f for f in report["extra"]["hub"]["repos"][0]["files"]}
    assert "onnx/model.onnx_data" not in stats  # external data is never downloaded by a scan
    for name in ("gguf/model-f16.gguf", "gguf-vocab/model-f16.gguf", "onnx/model.onnx"):
        assert stats[name]["requests"] <= 2, (name, stats[name])
    # a small header: one 64 KiB block; a 900 KiB one: that block, then one of 1 MiB
    assert stats["gguf/model-f16.gguf"]["requests"] == 1
    assert stats["gguf/model-f16.gguf"]["bytes"] < len(files["gguf/model-f16.gguf"]) / 100
    assert stats["gguf-vocab/model-f16.gguf"]["bytes"] <= 64 * 1024 + MB
    assert stats["onnx/model.onnx"]["requests"] == 1
    # inline weights and npz members have no index: one read after each large initializer or member
    assert stats["onnx-inline/model.onnx"]["requests"] <= 2 + 4
    assert stats["numpy/weights.npz"]["requests"] <= 1 + 4
    # the remote verdict and dtypes are the local ones
    local = tmp_path / "local"
    for name, data in files.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
    monkeypatch.chdir(local)
    _rc, mine = run_json(["scan", ".", "--expect", "uniform"], tmp_path / "l.json")
    assert sorted(str(m["dtypes"]) for m in report["models"]) == sorted(str(m["dtypes"]) for m in mine["models"])
    assert report["findings"] == mine["findings"] == []
