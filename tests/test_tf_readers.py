"""TensorFlow: tensor bundles (SavedModel variables, TF checkpoints) and TFLite, written by TensorFlow itself.

Judged against ``tf.train.list_variables`` / ``load_checkpoint().get_variable_to_dtype_map()``
and the ``tflite`` parser with LiteRT's interpreter.  TensorFlow is imported once, in the
session fixture that writes every sample (tests/tf_writers.py).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import tf_writers as tw
from fuzz_inputs import assert_refused, bounded_scan

from guard.cli import main
from guard.readers.tf.bundle import is_training_state, read_tf_bundle
from guard.readers.tf.tflite import read_tflite
from guard.sources import BytesSource, LocalFile


@pytest.fixture(scope="session")
def tf_samples(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    pytest.importorskip("tensorflow")
    pytest.importorskip("ai_edge_litert")
    root = tmp_path_factory.mktemp("tf")
    return root, tw.write_all(root)


def scan_json(args: list[str], out: Path) -> tuple[int, dict[str, Any]]:
    rc = main(["scan", *args, "--format", "json", "-o", str(out)])
    return rc, json.loads(out.read_text())


def codes(report: dict[str, Any]) -> list[str]:
    return sorted(f["code"] for f in report["findings"])


BUNDLES = ("mixed_saved_model/variables/variables", "fp32_saved_model/variables/variables",
           "bf16_saved_model/variables/variables", "train/ckpt-1", "fp16_ckpt/weights", "keras_train/ckpt-1",
           "keras_export/variables/variables", "sharded/weights")


@pytest.mark.parametrize("prefix", BUNDLES)
def test_bundle_index_reads_what_tensorflow_lists(tf_samples: tuple[Path, dict[str, Any]], prefix: str) -> None:
    root, refs = tf_samples
    with LocalFile(root / f"{prefix}.index") as source:
        scan = read_tf_bundle(source)
    ours = {t.name: (t.dtype, t.shape) for t in scan.tensors}
    theirs = {k: v for k, v in refs[prefix].items() if v[0] != "STRING" and not is_training_state(k)}
    assert ours == theirs
    assert scan.findings == ()
    left_out = {k for k in refs[prefix] if k not in ours}
    assert int(scan.metadata.get("tf.strings", 0)) + int(scan.metadata.get("tf.training_state", 0)) == len(left_out)
    assert source.reads == 1  # the whole (small) index in one read


def test_keras_training_checkpoint_keeps_optimizer_state_out(tf_samples: tuple[Path, dict[str, Any]]) -> None:
    root, refs = tf_samples
    with LocalFile(root / "keras_train" / "ckpt-1.index") as source:
        scan = read_tf_bundle(source)
    # Keras 3 tracks the model's variables through the optimizer: those are the weights, the slots are not
    assert sorted(t.name.split("/")[1] for t in scan.tensors) == ["_trainable_variables"] * 4
    assert scan.metadata["tf.training_state"] == "11"  # iterations, learning rate, 8 Adam slots, save_counter


def test_saved_model_is_one_set_and_clean(tf_samples: tuple[Path, dict[str, Any]], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = tf_samples
    monkeypatch.chdir(root)
    rc, report = scan_json(["fp32_saved_model"], tmp_path / "r.json")
    assert rc == 0 and codes(report) == []
    assert [m["path"] for m in report["models"]] == ["fp32_saved_model"]  # variables/ is not a model
    (model,) = report["models"]
    assert [s["name"] for s in model["sets"]] == ["variables.index"]
    assert report["summary"]["files"] == 1  # saved_model.pb and fingerprint.pb belong to the set: no CG006


def test_keras_export_and_checkpoints_pass_under_fp32(tf_samples: tuple[Path, dict[str, Any]], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = tf_samples
    monkeypatch.chdir(root)
    rc, report = scan_json(["keras_export", "train", "keras_train", "sharded"],
                           tmp_path / "r.json")
    assert rc == 0, report["findings"]
    models = {m["path"]: m for m in report["models"]}
    assert sorted(models) == ["keras_export", "keras_train", "sharded", "train"]
    # Dense(16 -> 64) and Dense(64 -> 8): model.export stores each variable twice, counted once
    assert models["keras_export"]["parameters"] == models["keras_train"]["parameters"] == 16 * 64 + 64 + 64 * 8 + 8


@pytest.mark.parametrize(("folder", "dtype"), [("bf16_saved_model", "bf16"), ("fp16_ckpt", "fp16")])
def test_low_precision_bundle_under_expect_fp32_is_cg101(tf_samples: tuple[Path, dict[str, Any]], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, folder: str,
                                                         dtype: str) -> None:
    root, _ = tf_samples
    monkeypatch.chdir(root)
    rc, report = scan_json([folder], tmp_path / "r.json")
    assert rc == 1 and "CG101" in codes(report)
    rc, report = scan_json([folder, "--expect", dtype], tmp_path / "r2.json")
    assert rc == 0 and codes(report) == []


def test_missing_or_short_data_shard_is_cg004(tf_samples: tuple[Path, dict[str, Any]], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = tf_samples
    copy = tmp_path / "sharded"
    shutil.copytree(root / "sharded", copy)
    monkeypatch.chdir(tmp_path)
    (copy / "weights.data-00001-of-00003").unlink()
    rc, report = scan_json(["sharded"], tmp_path / "r.json")
    assert rc == 1 and codes(report) == ["CG004"]
    assert "weights.data-00001-of-00003" in report["findings"][0]["message"]
    shutil.copy(root / "sharded" / "weights.data-00001-of-00003", copy)
    shard = copy / "weights.data-00002-of-00003"
    shard.write_bytes(shard.read_bytes()[:-4])
    rc, report = scan_json(["sharded"], tmp_path / "r2.json")
    assert rc == 1 and codes(report) == ["CG004"] and "truncated" in report["findings"][0]["message"]


def test_saved_model_missing_its_variables_shard_is_cg004(tf_samples: tuple[Path, dict[str, Any]],
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = tf_samples
    shutil.copytree(root / "fp32_saved_model", tmp_path / "sm")
    (tmp_path / "sm" / "variables" / "variables.data-00000-of-00001").unlink()
    monkeypatch.chdir(tmp_path)
    rc, report = scan_json(["sm"], tmp_path / "r.json")
    assert rc == 1 and codes(report) == ["CG004"]


def test_naming_a_file_inside_variables_scans_its_saved_model(tf_samples: tuple[Path, dict[str, Any]],
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pre-commit passes the changed files: a data shard stands for its SavedModel, never CG001 of its own."""
    root, _ = tf_samples
    monkeypatch.chdir(root)
    rc, report = scan_json(["fp32_saved_model/variables/variables.data-00000-of-00001",
                            "fp32_saved_model/saved_model.pb"], tmp_path / "r.json")
    assert rc == 0 and codes(report) == []
    assert [m["path"] for m in report["models"]] == ["fp32_saved_model"]


def test_every_truncation_of_a_real_index_is_cg001(tf_samples: tuple[Path, dict[str, Any]]) -> None:
    root, _ = tf_samples
    data = (root / "mixed_saved_model" / "variables" / "variables.index").read_bytes()
    for cut in range(0, len(data) - 1, 7):
        result = bounded_scan(data[:cut], "variables.index")
        assert result.scan.format is None and [f.code for f in result.scan.findings] == ["CG001"], cut
        assert result.seconds < 0.5


# ---------------------------------------------------------------- TFLite


@pytest.mark.parametrize("variant", ["fp32", "fp16", "dynamic", "int8"])
def test_tflite_constants_match_the_reference(tf_samples: tuple[Path, dict[str, Any]], variant: str) -> None:
    _, refs = tf_samples
    path = Path(refs["tflite"][variant])
    with LocalFile(path) as source:
        scan = read_tflite(source)
    assert {t.name: (t.dtype, t.shape) for t in scan.tensors} == tw.reference_tflite(path.read_bytes())
    assert ("quantization" in scan.metadata) == (variant in ("dynamic", "int8"))


@pytest.mark.parametrize(("variant", "rc", "found"), [("fp32", 0, []), ("fp16", 1, ["CG101"]),
                                                      ("dynamic", 0, []), ("int8", 0, [])])
def test_tflite_verdicts(tf_samples: tuple[Path, dict[str, Any]], tmp_path: Path, variant: str, rc: int,
                         found: list[str]) -> None:
    _, refs = tf_samples
    got, report = scan_json([refs["tflite"][variant]], tmp_path / "r.json")
    assert (got, codes(report)) == (rc, found)
    if variant in ("dynamic", "int8"):
        assert report["models"][0]["quantization"]


def test_every_truncation_of_a_real_tflite_is_cg001(tf_samples: tuple[Path, dict[str, Any]]) -> None:
    _, refs = tf_samples
    data = Path(refs["tflite"]["int8"]).read_bytes()
    for cut in range(0, len(data) - 1, 5):
        result = bounded_scan(data[:cut], "model.tflite")
        assert result.scan.format is None and [f.code for f in result.scan.findings] == ["CG001"], cut
        assert result.seconds < 0.5


# ---------------------------------------------------------------- hostile bytes (no TensorFlow needed)

HEADER = (b"", tw.header())


def _index(*entries: tuple[bytes, bytes], **kw: Any) -> bytes:
    return tw.table([HEADER, *entries], **kw)


def test_hand_made_index_is_read() -> None:
    scan = read_tf_bundle(BytesSource(_index((b"w", tw.entry(1, [3, 4]))), name="m/x.index"))
    assert [(t.name, t.dtype, t.shape, t.file) for t in scan.tensors] == [("w", "F32", (3, 4),
                                                                          "m/x.data-00000-of-00001")]


BAD_INDEXES = {
    "no magic": (_index()[:-8] + b"\x00" * 8, "not a weight file"),
    "restart past entries": (_index(data_block=tw.block([HEADER], restarts=[0, 999])), "restart"),
    "restart count 2^32-1": (_index(data_block=tw.block([HEADER])[:-4] + b"\xff\xff\xff\xff"), "restart"),
    "restart not at an entry": (_index(data_block=tw.block([HEADER, (b"a", b"")], restarts=[0, 3])), "restart"),
    "no restarts": (_index(data_block=tw.block([HEADER], restarts=[])), "restart"),
    "dims of 2^63": (_index((b"w", tw.entry(1, [2**62, 4]))), "2^63"),
    "negative dim": (_index((b"w", tw.entry(1, [-1]))), "dimension"),
    "2^31 shards": (tw.table([(b"", tw.header(2**31 - 1)), (b"w", tw.entry(1, [1]))]), "shards"),
    "shard out of range": (_index((b"w", tw.entry(1, [1], shard=5))), "shard 5"),
    "size disagrees": (_index((b"w", tw.entry(1, [3], size=2**63 - 1))), "needs 12"),
    "offset of 2^63": (_index((b"w", tw.entry(1, [1], offset=2**63))), "negative"),
    "no header": (tw.table([(b"w", tw.entry(1, [1]))]), "header"),
    "unsorted keys": (_index((b"b", tw.entry(1, [1])), (b"a", tw.entry(1, [1]))), "ascending"),
}


@pytest.mark.parametrize("case", sorted(BAD_INDEXES))
def test_hostile_indexes_are_cg001_fast_and_small(case: str) -> None:
    data, reason = BAD_INDEXES[case]
    assert_refused(data, "variables.index", reason)


def test_a_flipped_bit_fails_the_block_crc() -> None:
    data = bytearray(_index((b"w", tw.entry(1, [3, 4]))))
    data[12] ^= 1
    assert_refused(bytes(data), "x.index", "crc32c")


def test_a_snappy_block_is_refused_by_name() -> None:
    contents = tw.block([HEADER])
    data = _index(data_block=contents)
    block = tw.with_trailer(contents, kind=1)
    assert_refused(block + data[len(block):], "x.index", "snappy")


def _tflite_bytes() -> bytes:
    """A real-shaped TFLite model built with the flatbuffers builder and the ``tflite`` package's schema."""
    flatbuffers = pytest.importorskip("flatbuffers")
    tflite = pytest.importorskip("tflite")
    b = flatbuffers.Builder(0)
    payload = b.CreateByteVector(bytes(48))
    tflite.BufferStart(b)
    tflite.BufferAddData(b, payload)
    filled = tflite.BufferEnd(b)
    tflite.BufferStart(b)
    empty = tflite.BufferEnd(b)
    name = b.CreateString("dense/kernel")
    tflite.TensorStartShapeVector(b, 2)
    b.PrependInt32(4)
    b.PrependInt32(3)
    shape = b.EndVector()
    tflite.TensorStart(b)
    tflite.TensorAddShape(b, shape)
    tflite.TensorAddType(b, 0)
    tflite.TensorAddBuffer(b, 1)
    tflite.TensorAddName(b, name)
    tensor = tflite.TensorEnd(b)
    tflite.SubGraphStartTensorsVector(b, 1)
    b.PrependUOffsetTRelative(tensor)
    tensors = b.EndVector()
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tensors)
    subgraph = tflite.SubGraphEnd(b)
    tflite.ModelStartSubgraphsVector(b, 1)
    b.PrependUOffsetTRelative(subgraph)
    subgraphs = b.EndVector()
    tflite.ModelStartBuffersVector(b, 2)
    b.PrependUOffsetTRelative(filled)
    b.PrependUOffsetTRelative(empty)
    buffers = b.EndVector()
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddSubgraphs(b, subgraphs)
    tflite.ModelAddBuffers(b, buffers)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def test_built_tflite_is_read() -> None:
    scan = read_tflite(BytesSource(_tflite_bytes(), name="model.tflite"))
    assert [(t.name, t.dtype, t.shape, t.data_end - t.data_start) for t in scan.tensors] == [
        ("dense/kernel", "F32", (3, 4), 48)]


def _patched(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value):]


def _bad_tflites() -> dict[str, tuple[bytes, str]]:
    data = _tflite_bytes()
    root = struct.unpack_from("<I", data)[0]
    return {
        "root past the end": (_patched(data, 0, struct.pack("<I", len(data) + 64)), "past the end"),
        "root misaligned": (_patched(data, 0, struct.pack("<I", root + 1)), "aligned"),
        "vtable is the table itself": (_patched(data, root, struct.pack("<i", 0)), "schema version 0"),
        "vtable far before the start": (_patched(data, root, struct.pack("<i", 2**31 - 2)), "past the end"),
        "vector of 2^32-1 tables": (_vector_length(data, 2**32 - 1), "claims"),
        "cut": (data[: len(data) // 2], "past the end"),
    }


def _vector_length(data: bytes, count: int) -> bytes:
    """Overwrite the length of Model.subgraphs (field 2 of the root table)."""
    root = struct.unpack_from("<I", data)[0]
    vtable = root - struct.unpack_from("<i", data, root)[0]
    field = root + struct.unpack_from("<H", data, vtable + 4 + 2 * 2)[0]
    vector = field + struct.unpack_from("<I", data, field)[0]
    return _patched(data, vector, struct.pack("<I", count))


@pytest.mark.parametrize("case", ["root past the end", "root misaligned", "vtable is the table itself",
                                  "vtable far before the start", "vector of 2^32-1 tables", "cut"])
def test_hostile_flatbuffers_are_cg001_fast_and_small(case: str) -> None:
    data, reason = _bad_tflites()[case]
    assert_refused(data, "model.tflite", reason)



# ---------------------------------------------------------------- the Hub (stand-in), ranged reads


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    pytest.importorskip("huggingface_hub")
    from hub_standin import standin_fixture

    yield from standin_fixture(monkeypatch, tmp_path)


def test_hub_scan_reads_tensorflow_files_remotely(tf_samples: tuple[Path, dict[str, Any]], standin: Any,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, refs = tf_samples
    repo = tmp_path / "repo"
    for folder in ("fp32_saved_model", "bf16_saved_model", "train", "sharded"):
        shutil.copytree(root / folder, repo / folder)
    (repo / "lite").mkdir()
    shutil.copy(refs["tflite"]["int8"], repo / "lite" / "model.tflite")
    (repo / "sharded" / "weights.data-00001-of-00003").unlink()  # CG004, remotely too
    (repo / "faiss.index").write_bytes(b"\x00" * 70_000)  # another tool's .index: not a weight file
    standin.add_repo("org/tf", repo)
    monkeypatch.chdir(tmp_path)
    rc, remote = scan_json_hub(["org/tf"], tmp_path / "remote.json")
    monkeypatch.chdir(repo)
    _rc, local = scan_json(["."], tmp_path / "local.json")
    assert rc == 1
    assert codes(remote) == codes(local) == ["CG004", "CG101"]
    assert sorted(m["path"].removeprefix("org/tf/") for m in remote["models"]) == sorted(
        m["path"].removeprefix("./") for m in local["models"]) == ["bf16_saved_model", "fp32_saved_model", "lite",
                                                                  "sharded", "train"]
    stats = {f["path"]: f for f in remote["extra"]["hub"]["repos"][0]["files"]}
    assert not any(".data-" in name or name.endswith(".pb") or name == "faiss.index" for name in stats)
    for name in ("fp32_saved_model/variables/variables.index", "train/ckpt-1.index", "lite/model.tflite"):
        assert stats[name]["requests"] <= 2, stats[name]


def scan_json_hub(args: list[str], out: Path) -> tuple[int, dict[str, Any]]:
    rc = main(["hub", "scan", *args, "--format", "json", "-o", str(out)])
    return rc, json.loads(out.read_text())
