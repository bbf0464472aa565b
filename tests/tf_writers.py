"""TensorFlow files written by TensorFlow itself, and the reference readers' view of them (not a test module).

TensorFlow takes ~10 s to import: ``write_all`` builds every sample once (the
test module calls it from a session-scoped fixture), and the references are read
in the same pass.  ``table`` writes a LevelDB table by hand for the malformed
cases; a test checks TensorFlow reads its valid output.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from onnx_reference import varint as onnx_varint

from guard.readers.tf.leveldb_table import MAGIC_BYTES, masked_crc

Listing = dict[str, tuple[str, tuple[int, ...]]]
TF_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
            "int32": "I32", "int8": "I8", "uint8": "U8", "int16": "I16", "bool": "BOOL", "string": "STRING"}


def write_all(root: Path) -> dict[str, Any]:
    """Every sample under ``root``; returns {sample: reference listing or details}."""
    import keras
    import numpy as np
    import tensorflow as tf

    out: dict[str, Any] = {}

    class Mixed(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(tf.ones((3, 4)))
            self.b = tf.Variable(tf.zeros((4,), tf.bfloat16))
            self.h = tf.Variable(tf.zeros((2,), tf.float16))
            self.i = tf.Variable(tf.zeros((5,), tf.int64))

        @tf.function(input_signature=[tf.TensorSpec([None, 3])], autograph=False)
        def __call__(self, x: Any) -> Any:
            return tf.matmul(x, self.w)

    class Plain(tf.Module):
        def __init__(self, dtype: Any) -> None:
            self.kernel = tf.Variable(tf.ones((8, 4), dtype))
            self.bias = tf.Variable(tf.zeros((4,), dtype))

    tf.saved_model.save(Mixed(), str(root / "mixed_saved_model"))
    tf.saved_model.save(Plain(tf.float32), str(root / "fp32_saved_model"))
    tf.saved_model.save(Plain(tf.bfloat16), str(root / "bf16_saved_model"))
    tf.train.Checkpoint(model=Plain(tf.float32)).save(str(root / "train" / "ckpt"))
    tf.train.Checkpoint(model=Plain(tf.float16)).write(str(root / "fp16_ckpt" / "weights"))
    # two data shards: TF >= 2.16 splits a checkpoint by size through a sharding callback
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=200)
    sharded = Plain(tf.float32)
    sharded.extra = tf.Variable(tf.ones((16, 4)))
    tf.train.Checkpoint(model=sharded).write(str(root / "sharded" / "weights"),
                                             options=tf.train.CheckpointOptions(experimental_sharding_callback=policy))
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64), keras.layers.Dense(8)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 16)), np.ones((4, 8)), verbose=0)
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(root / "keras_train" / "ckpt"))
    model.export(str(root / "keras_export"), verbose=False)
    for name in ("mixed_saved_model/variables/variables", "fp32_saved_model/variables/variables",
                 "bf16_saved_model/variables/variables", "train/ckpt-1", "fp16_ckpt/weights",
                 "keras_train/ckpt-1", "keras_export/variables/variables", "sharded/weights"):
        out[name] = reference_bundle(str(root / name))
    out["tflite"] = _tflite(root, model, tf, np)
    return out


def reference_bundle(prefix: str) -> Listing:
    import tensorflow as tf

    dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
    return {name: (TF_CODES[dtypes[name].name], tuple(shape)) for name, shape in tf.train.list_variables(prefix)}


def _tflite(root: Path, model: Any, tf: Any, np: Any) -> dict[str, str]:
    def representative() -> Any:
        for _ in range(8):
            yield [np.random.default_rng(0).random((1, 16), np.float32)]

    variants: dict[str, dict[str, Any]] = {
        "fp32": {}, "fp16": {"optimizations": [tf.lite.Optimize.DEFAULT], "types": [tf.float16]},
        "dynamic": {"optimizations": [tf.lite.Optimize.DEFAULT]},
        "int8": {"optimizations": [tf.lite.Optimize.DEFAULT], "representative": representative},
    }
    files = {}
    for name, options in variants.items():
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = options.get("optimizations", [])
        if "types" in options:
            converter.target_spec.supported_types = options["types"]
        if "representative" in options:
            converter.representative_dataset = options["representative"]
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
        path = root / "tflite" / name / "model.tflite"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(converter.convert())
        files[name] = str(path)
    return files


def reference_tflite(data: bytes) -> Listing:
    """Constant tensors (a buffer with data) as LiteRT's interpreter and the ``tflite`` parser see them."""
    from fuzz_formats_tf import tflite_constants

    listing = tflite_constants(data)
    assert not isinstance(listing, str), listing
    return listing


# ---------------------------------------------------------------- hand-made tables (malformed cases)

def varint(n: int) -> bytes:
    return onnx_varint(n & (2**64 - 1))  # negative numbers as protobuf sends them (ten bytes)


def block(entries: list[tuple[bytes, bytes]], *, restarts: list[int] | None = None) -> bytes:
    body = b"".join(varint(0) + varint(len(k)) + varint(len(v)) + k + v for k, v in entries)
    points = [0] if restarts is None else restarts
    return body + b"".join(struct.pack("<I", r) for r in points) + struct.pack("<I", len(points))


def with_trailer(contents: bytes, kind: int = 0) -> bytes:
    return contents + bytes([kind]) + struct.pack("<I", masked_crc(contents + bytes([kind])))


def table(entries: list[tuple[bytes, bytes]], *, data_block: bytes | None = None) -> bytes:
    """One data block with ``entries`` (or the given block contents), an empty metaindex, the index, the footer."""
    data = with_trailer(data_block if data_block is not None else block(entries))
    meta_at = len(data)
    meta = with_trailer(block([]))
    index_at = meta_at + len(meta)
    handle = varint(0) + varint(len(data) - 5)
    index = with_trailer(block([(b"\xff", handle)]))
    footer = varint(meta_at) + varint(len(meta) - 5) + varint(index_at) + varint(len(index) - 5)
    return data + meta + index + footer.ljust(40, b"\x00") + MAGIC_BYTES


def header(num_shards: int = 1) -> bytes:
    return b"\x08" + varint(num_shards) + b"\x1a\x02\x08\x01"


def entry(dtype: int, dims: list[int], *, shard: int = 0, offset: int = 0, size: int | None = None) -> bytes:
    shape = b"".join(b"\x12" + varint(len(d)) + d for d in (b"\x08" + varint(x & (2**64 - 1)) for x in dims))
    width = {1: 4, 19: 2, 14: 2, 9: 8}.get(dtype, 4)
    n = 1
    for d in dims:
        n *= d
    size = n * width if size is None else size
    return (b"\x08" + varint(dtype) + b"\x12" + varint(len(shape)) + shape + b"\x18" + varint(shard)
            + b"\x20" + varint(offset) + b"\x28" + varint(size))
