"""TensorFlow bundle indexes and TFLite for the fuzz machinery of ``fuzz_inputs`` (not a test module).

Samples are the committed seeds in fuzz/corpus/ (written by TensorFlow through
``tf_writers.write_all``; ``fuzz/make_corpus.py`` rewrites them).  References:
``tf.train.list_variables`` + ``load_checkpoint().get_variable_to_dtype_map()`` for a
bundle index, LiteRT's ``Interpreter(model_content=...)`` (which runs the flatbuffer
Verifier) plus the ``tflite`` parser for the constants.  TensorFlow CHECK-fails, and so
aborts the process, on some corrupt indexes: each reference runs in a forked child of
a process that imported TensorFlow once, and an abort is the reference refusing.
Both sides list the same things: no strings, no training state, no slice entries.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from guard.readers.tf.bundle import is_training_state

Inventory = dict[str, tuple[str, tuple[int, ...]]]
CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "corpus"
FILE_NAMES_TF = {"tf-bundle": "variables.index", "tflite": "model.tflite"}
REFERENCE_SECONDS = 5.0
TF_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
            "int32": "I32", "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16", "uint32": "U32",
            "uint64": "U64", "bool": "BOOL", "complex64": "C64", "complex128": "C128", "float8_e5m2": "F8_E5M2",
            "float8_e4m3fn": "F8_E4M3", "int4": "I4", "uint4": "U4"}


def _forked(function: Callable[[bytes], Inventory | str], data: bytes) -> Inventory | str:
    """``function(data)`` in a forked child: an abort or a hang there is the reference refusing the file."""
    warm_up()  # once per process: every child starts with TensorFlow imported
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test process
        try:
            os.close(read_end)
            try:
                result: Inventory | str = function(data)
            except BaseException as exc:  # noqa: BLE001 - any failure is the reference's verdict
                result = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            payload = pickle.dumps(result)
            while payload:
                payload = payload[os.write(write_end, payload):]
        finally:
            os._exit(0)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline, timed_out = time.monotonic() + REFERENCE_SECONDS, False
    try:
        while True:
            remaining = deadline - time.monotonic()
            ready = select.select([read_end], [], [], remaining)[0] if remaining > 0 else []
            if not ready:
                timed_out = True
                break
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
    if timed_out:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return f"no answer after {REFERENCE_SECONDS:g} s"
    if os.WIFSIGNALED(status) or not chunks:
        return f"aborted (status {status})"
    value: Inventory | str = pickle.loads(b"".join(chunks))
    return value


def _bundle_listing(data: bytes) -> Inventory | str:
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "variables")
        Path(prefix + ".index").write_bytes(data)
        Path(prefix + ".data-00000-of-00001").write_bytes(bytes(4096))
        dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
        shapes = dict(tf.train.list_variables(prefix))
    out: Inventory = {}
    for name, dtype in dtypes.items():
        if dtype.name == "string" or dtype.name in ("resource", "variant") or is_training_state(name):
            continue
        if name.startswith("\x00"):
            continue
        if dtype.name not in TF_CODES:
            return f"dtype {dtype.name} has no code"
        out[name] = (TF_CODES[dtype.name], tuple(shapes[name]))
    return out


def tflite_constants(data: bytes) -> Inventory | str:
    import tflite
    from ai_edge_litert.interpreter import Interpreter

    Interpreter(model_content=data)  # runs the flatbuffer verifier and builds the graph
    codes = {0: "F32", 1: "F16", 2: "I32", 3: "U8", 4: "I64", 6: "BOOL", 7: "I16", 9: "I8", 10: "F64",
             18: "BF16"}
    model = tflite.Model.GetRootAs(data, 0)
    out: Inventory = {}
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for i in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(i)
            index = tensor.Buffer()
            if index == 0:
                continue
            buffer = model.Buffers(index)
            if buffer.DataLength() == 0 and not (buffer.Offset() > 1 and buffer.Size()):
                continue
            if tensor.Type() == 5:
                continue
            if tensor.Type() not in codes:
                return f"type {tensor.Type()} has no code"
            name = tensor.Name().decode("utf-8", "backslashreplace") if tensor.Name() else f"subgraph{g}/tensor{i}"
            name = f"subgraph{g}/{name}" if g else name
            out[name] = (codes[tensor.Type()], tuple(int(d) for d in tensor.ShapeAsNumpy())
                         if tensor.ShapeLength() else ())
    return out


def reference_tf_bundle(data: bytes) -> Inventory | str:
    return _forked(_bundle_listing, data)


def reference_tflite(data: bytes) -> Inventory | str:
    return _forked(tflite_constants, data)


def _seeds(folder: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((CORPUS / folder).glob("seed-*"))]


REFERENCES_TF: dict[str, Callable[[bytes], Inventory | str]] = {
    "tf-bundle": reference_tf_bundle, "tflite": reference_tflite}
SAMPLERS_TF: dict[str, Callable[[], list[bytes]]] = {
    "tf-bundle": lambda: _seeds("tf_bundle"), "tflite": lambda: _seeds("tflite")}

# (category, formats, we_accept, pattern): docs/reliability.md explains each
KNOWN_TF: tuple[tuple[str, tuple[str, ...], bool, str], ...] = (
    ("unknown-dtype", ("tf-bundle", "tflite"), True, r"^CG005$"),
    # list_variables reads entries until a block goes bad, then stops without an error: it lists what came
    # before.  We refuse the index (a restore of the variables after it fails).
    ("stops-at-bad-block", ("tf-bundle",), False, r"bad entry|restart|crc32c"),
    # list_variables does not compare an entry's size with its dtype and shape, nor the key order; a restore
    # reads exactly size bytes into the tensor, and looks names up by binary search.
    ("size-checked", ("tf-bundle",), False, r"needs [\d,]+$|not in ascending order"),
    # A header of 0 (or a negative number of) shards: list_variables never opens a shard; a restore does.
    ("header-checked", ("tf-bundle",), False, r"header says -?[\d,]+ shards"),
    # Keys that start with a 0 byte are slices' (binary ordered code): we leave them undecoded; TensorFlow
    # decodes those that no variable lists as its slice, and a mutant's may not be UTF-8.
    ("slice-keys-not-decoded", ("tf-bundle",), True, r"UnicodeDecodeError"),
    # The interpreter resolves every operator against its kernels; a scan reads tensors, not operators,
    # so an opcode or version this LiteRT cannot run (a newer one may) is no reason to refuse the weights.
    ("op-resolution", ("tflite",), True, r"Didn't find op for|unresolved custom op|Op builtin_code out of range"
                                         r"|Registration failed"),
    # Flatbuffer strings are bytes to the Verifier and to us (names shown escaped); LiteRT's Python wrapper
    # decodes some of them as UTF-8.
    ("non-utf8-name", ("tflite",), True, r"UnicodeDecodeError"),
    # The Verifier walks every table of the schema, operator options and sparsity parameters included; we
    # check the tables that place tensors and the bounds of the rest (guard/readers/tf/tflite.py).
    ("verifier-deeper", ("tflite",), True, r"not a valid Flatbuffer buffer"),
)


def warm_up() -> None:
    """Import TensorFlow and LiteRT once in this process, so that each forked reference starts warm."""
    import tensorflow  # noqa: F401
    import tflite  # noqa: F401
    from ai_edge_litert.interpreter import Interpreter  # noqa: F401




def repair_crcs(data: bytes) -> bytes:
    """The index with every block's crc recomputed, where its footer and index block still parse.

    TensorFlow checks every block's crc, so nearly every plain mutant is refused on both sides for that
    alone; re-sealed mutants reach the entry and restart parsing on both sides.
    """
    from guard.errors import MalformedCheckpoint
    from guard.readers.tf.leveldb_table import FOOTER, TRAILER, block_entries, masked_crc, read_footer, varint

    out = bytearray(data)

    def seal(offset: int, size: int) -> bool:
        end = offset + size
        if offset < 0 or end + TRAILER > len(out) - FOOTER:
            return False
        out[end + 1 : end + 5] = masked_crc(bytes(out[offset : end + 1])).to_bytes(4, "little")
        return True

    try:
        _meta, (index_at, index_size) = read_footer(bytes(out))
        if not seal(index_at, index_size):
            return data
        for _key, start, end in block_entries(bytes(out), (index_at, index_at + index_size), "index block"):
            offset, pos = varint(bytes(out), start, end, "handle")
            size, _ = varint(bytes(out), pos, end, "handle")
            seal(offset, size)
    except (MalformedCheckpoint, ValueError, IndexError):
        return data
    return bytes(out)
