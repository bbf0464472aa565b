"""Replay the committed fuzz corpora (seeds and every crash ever found) through scan_file."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from fuzz_inputs import assert_well_behaved, bounded_scan

FUZZ = Path(__file__).resolve().parent.parent / "fuzz"
# target folder -> file name the dispatcher sees (content sniffing decides; the name breaks ties)
NAMES = {"safetensors": "model.safetensors", "torch_zip": "pytorch_model.bin",
         "torch_legacy": "pytorch_model.bin", "torch_export": "model.pt2", "executorch": "model.pte",
         "torchscript": "model.pt", "flax_msgpack": "flax_model.msgpack",
         "torch_pickle": "data.pkl", "gguf": "model.gguf", "onnx": "model.onnx", "npy": "weights.npy",
         "npz": "weights.npz", "hdf5": "model.weights.h5", "keras": "model.keras", "orbax_metadata": "_METADATA",
         "tf_bundle": "variables.index", "tflite": "model.tflite",
         "openvino": "openvino_model.xml", "coreml": "weight.bin",
         "coreml_spec": "model.mlmodel"}
# training checkpoints are folders: each target's input is one of their files, read as a scan reads it
# (tests/fuzz_formats_training.py, shared with fuzz/fuzz_dcp_metadata.py and fuzz/fuzz_zero_states.py)
TRAINING_TARGETS = ("dcp_metadata", "zero_states")
ALL_FILES = sorted(p for kind in ("corpus", "regressions") for p in (FUZZ / kind).glob("*/*")
                   if p.is_file() and not p.name.startswith("."))
FILES = [p for p in ALL_FILES if p.parent.name not in TRAINING_TARGETS]
TRAINING_FILES = [p for p in ALL_FILES if p.parent.name in TRAINING_TARGETS]


def test_corpora_are_small_and_cover_every_target() -> None:
    assert sum(p.stat().st_size for p in ALL_FILES) < 2 * 1024 * 1024
    assert {p.parent.name for p in ALL_FILES if p.parent.parent.name == "corpus"} == {*NAMES, *TRAINING_TARGETS}


@pytest.mark.parametrize("path", TRAINING_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}")
def test_training_replay_never_raises_hangs_or_balloons(path: Path) -> None:
    from bounds import no_hang, traced
    from fuzz_formats_training import read_dcp_metadata_input, read_zero_input
    from fuzz_inputs import SCAN_PEAK_BYTES

    data = path.read_bytes()
    read = read_dcp_metadata_input if path.parent.name == "dcp_metadata" else read_zero_input
    with traced() as peak, no_hang():
        read(data)  # a READ_FAILURES refusal is caught inside; anything else fails here
    assert peak.bytes < SCAN_PEAK_BYTES + 2 * len(data)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}")
def test_replay_never_raises_hangs_or_balloons(path: Path) -> None:
    data = path.read_bytes()
    result = bounded_scan(data, NAMES[path.parent.name])
    assert_well_behaved(result, data)


@pytest.mark.parametrize("path", sorted((FUZZ / "corpus" / "torch_pickle").glob("*.pkl")), ids=lambda p: p.name)
def test_pickle_seeds_walk_without_error(path: Path) -> None:
    from guard.readers.torch import pickle as torch_pickle

    helpers = pytest.importorskip("guard.readers.torch.tensors") if not hasattr(
        torch_pickle, "storage_from_pid") else torch_pickle
    walker = torch_pickle.PickleWalker(helpers.storage_from_pid)
    walker.walk(io.BytesIO(path.read_bytes()))
    assert not walker.unsafe


@pytest.mark.parametrize("target", ["torch_zip", "torch_legacy"])
def test_empty_slice_at_an_offset_is_readable(target: str) -> None:
    """torch.save({"sliced": torch.zeros(2, 0)[1:]}): torch.load accepts it (numel 0 at offset 1).

    Found by tests/test_fuzz_readers.py; the reader refuses it with CG001
    ("runs past its storage '0' (0 bytes)").  Owned by the torch reader.
    """
    data = (FUZZ / "regressions" / target / "empty-slice-at-offset.bin").read_bytes()
    result = bounded_scan(data, "pytorch_model.bin")
    assert result.valid, result.reason
    assert result.inventory == {"sliced": ("F32", (1, 0))}


@pytest.mark.parametrize("name", ["eocd-comment-length-past-the-end.bin", "zip64-record-without-signature.bin"])
def test_zip_records_torch_tolerates_are_tolerated(name: str) -> None:
    """miniz (torch.load) takes the last end record whatever its comment length says, and ignores
    a zip64 record without its signature; found by the differential run (stricter-zip before)."""
    data = (FUZZ / "regressions" / "torch_zip" / name).read_bytes()
    result = bounded_scan(data, "pytorch_model.bin")
    assert result.valid, result.reason
    assert result.inventory == {"w": ("F32", (3,))}


def test_gguf_string_value_skipped_by_its_length() -> None:
    """A string value of a key the reader does not keep was skipped 8 bytes short (`pos += count()`
    lost the length's own 8 bytes); found by the differential run against GGUFReader."""
    gguf = pytest.importorskip("gguf")
    path = FUZZ / "regressions" / "gguf" / "unkept-string-value.gguf"
    result = bounded_scan(path.read_bytes(), "model.gguf")
    reader = gguf.GGUFReader(path)
    assert result.valid, result.reason
    assert result.inventory == {t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())))
                                for t in reader.tensors}
