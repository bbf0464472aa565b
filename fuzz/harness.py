"""What every atheris target shares: instrumented imports and the dispatcher's contract.

A target feeds bytes to one reader exactly as ``guard.readers.scan_file`` does
and lets anything outside ``READ_FAILURES`` escape: atheris then saves the
input (``-artifact_prefix`` points into fuzz/regressions/<reader>/).  libFuzzer's
``-timeout`` turns a hang into a crash, ``-rss_limit_mb`` a big allocation.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports(include=["guard"]):
    from guard.readers import READ_FAILURES, READERS, reader_for
    from guard.readers.torch import pickle as torch_pickle

    _LOADED = {fmt: reader_for(fmt) for fmt in READERS}  # reader modules load lazily: instrument them here
    from guard.sources import BytesSource

    try:  # the torch helpers moved between modules while the readers were written
        from guard.readers.torch import tensors as _tensor_helpers
    except ImportError:
        _tensor_helpers = torch_pickle  # type: ignore[assignment]

FILE_NAMES = {
    "safetensors": "model.safetensors",
    "torch-zip": "pytorch_model.bin",
    "torch-legacy": "pytorch_model.bin",
    "torch-export": "model.pt2",
    "executorch": "model.pte",
    "openvino": "openvino_model.xml",
    "coreml": "weight.bin",  # a Core ML package's MIL blob storage
    "coreml-spec": "model.mlmodel",
    "flax-msgpack": "flax_model.msgpack",
    "tf-bundle": "variables.index",
    "tflite": "model.tflite",
    "hdf5": "model.weights.h5",
    "keras": "model.keras",
    "gguf": "model.gguf",
    "onnx": "model.onnx",
    "npy": "weights.npy",
    "npz": "weights.npz",
}


def reader_target(reader: str) -> Callable[[bytes], None]:
    read = _LOADED[reader]
    name = FILE_NAMES[reader]

    def one_input(data: bytes) -> None:
        try:
            read(BytesSource(data, name=name))
        except READ_FAILURES:
            pass  # CG001: the dispatcher's contract

    return one_input


def pickle_target(data: bytes) -> None:
    walker = torch_pickle.PickleWalker(_tensor_helpers.storage_from_pid)
    try:
        root = walker.walk(io.BytesIO(data))
        for _ in _tensor_helpers.iter_named_tensors(root, budget=max(100_000, 4 * walker.opcodes)):
            pass
    except READ_FAILURES:
        pass


def main(target: Callable[[bytes], None]) -> None:
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
