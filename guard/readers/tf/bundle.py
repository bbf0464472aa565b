"""TensorFlow tensor bundles (``variables/variables.index``, ``ckpt-N.index``): dtypes and shapes from the index.

The ``.index`` file is a LevelDB-format table (``guard.readers.tf.leveldb_table``)
from variable names to ``BundleEntryProto`` (tensorflow/core/protobuf/tensor_bundle.proto:
dtype, shape, shard_id, offset, size, crc32c, slices); its first entry, under the
empty key, is the ``BundleHeaderProto`` (num_shards, endianness, version).  The
bytes live in ``<prefix>.data-0000k-of-0000n`` beside the index: each tensor
points there, the shards are the scan's companions, and ``shard_findings``
checks them (CG004) once the directory listing is known.

What is a weight (docs/formats.md):
* string entries (``_CHECKPOINTABLE_OBJECT_GRAPH``, lookup-table keys) are not
  tensors of the model and are not listed;
* training state is not listed either: optimizer variables (TF2 slot variables
  under ``.OPTIMIZER_SLOT``, anything under an ``optimizer`` object except the
  model variables Keras 3 tracks as its ``_trainable_variables``, TF1's
  ``*/Adam``-style slots and ``beta1_power``), ``save_counter`` and
  ``global_step``.  Their count is in the metadata, and their byte ranges are
  still checked against the shards;
* slice entries of partitioned variables (keys that start with a 0 byte) are
  data of the variable that lists them, not variables.
Checks beyond TensorFlow's list_variables (which aborts the process on some of
these) are those a restore would fail on: every block's crc, sizes that match
dtype and shape, shard ids within num_shards, shapes of known rank and size.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, shown
from guard.readers.binary.protobuf import FIXED32, LEN, VARINT, Wire
from guard.readers.binary.window import Window
from guard.readers.tf.leveldb_table import table_entries
from guard.sources import ByteSource, BytesSource
from guard.tensors import FileScan, TensorInfo

MAX_INDEX = 64 * 1024 * 1024  # ~1M variables; a bigger index is refused rather than held
MAX_SHARDS = 100_000
MAX_RANK = 254  # TensorShape's limit: TensorFlow aborts beyond it
BUNDLE_VERSION = 1  # kTensorBundleVersion: the consumer version CheckVersions compares with

# tensorflow/core/framework/types.proto DataType -> dtype code (the _REF variants are +100, never stored)
DATA_TYPES: dict[int, str] = {
    1: "F32", 2: "F64", 3: "I32", 4: "U8", 5: "I16", 6: "I8", 7: "STRING", 8: "C64", 9: "I64", 10: "BOOL",
    14: "BF16", 17: "U16", 18: "C128", 19: "F16", 22: "U32", 23: "U64",
    24: "F8_E5M2", 25: "F8_E4M3", 26: "F8_E4M3FNUZ", 28: "F8_E5M2FNUZ", 29: "I4", 30: "U4", 31: "I2", 32: "U2",
}
# Quantized (DT_QINT8 ...), resource, variant and float8_e4m3b11fnuz have no code: CG005 with TF's name.
TF_NAMES: dict[int, str] = {11: "DT_QINT8", 12: "DT_QUINT8", 13: "DT_QINT32", 15: "DT_QINT16", 16: "DT_QUINT16",
                            20: "DT_RESOURCE", 21: "DT_VARIANT", 27: "DT_FLOAT8_E4M3B11FNUZ"}

SCHEMA = {
    "BundleHeaderProto": {1: "varint", 2: "varint", 3: "VersionDef"},
    "VersionDef": {1: "varint", 2: "varint", 3: "varint*"},
    "BundleEntryProto": {1: "varint", 2: "TensorShapeProto", 3: "varint", 4: "varint", 5: "varint", 6: "fixed32",
                         7: "TensorSliceProto*"},
    "TensorShapeProto": {2: "Dim*", 3: "varint"},
    "Dim": {1: "varint", 2: "bytes"},
    "TensorSliceProto": {1: "Extent*"},
    "Extent": {1: "varint", 2: "varint"},
}
_TF1_SLOTS = frozenset({"Adam", "Adam_1", "Momentum", "RMSProp", "RMSProp_1", "Adagrad", "Ftrl", "Ftrl_1",
                        "Adadelta", "Adadelta_1", "AdamW", "AdamW_1"})
_TF1_STATE = frozenset({"global_step", "beta1_power", "beta2_power", "save_counter"})


def _signed(value: int, bits: int = 64) -> int:
    return value - (1 << 64) if value >= 1 << (bits - 1) else value


class _Entry:
    __slots__ = ("dtype", "shape", "shard", "offset", "size", "sliced", "crc")
    shape: tuple[int, ...]

    def __init__(self) -> None:
        self.dtype, self.shape, self.shard, self.offset, self.size, self.sliced = 0, (), 0, 0, 0, False
        self.crc = 0


def is_training_state(key: str) -> bool:
    """Optimizer variables and counters (see the module docstring); model variables are not."""
    parts = key.split("/")
    if "_trainable_variables" in parts:  # Keras 3: the model's own variables, seen first through the optimizer
        return False
    if ".OPTIMIZER_SLOT" in parts or parts[0] in _TF1_STATE or parts[-1] in _TF1_SLOTS:
        return True
    return any(part == "optimizer" or part.endswith("_optimizer") for part in parts)


def data_file_name(index_name: str, shard: int, num_shards: int) -> str:
    prefix = index_name[: -len(".index")] if index_name.endswith(".index") else index_name
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def read_tf_bundle(source: ByteSource) -> FileScan:
    if source.size > MAX_INDEX:
        raise MalformedCheckpoint(f"tensor bundle index of {source.size:,} bytes is larger than {MAX_INDEX:,}")
    data = source.read_at(0, source.size)
    wire = Wire(Window(BytesSource(data, name=source.name)), SCHEMA)
    entries = table_entries(data)
    first = next(entries, None)
    if first is None or first[0] != b"":
        raise MalformedCheckpoint("tensor bundle index has no header entry (the empty key) first")
    num_shards, metadata = _header(wire, first[1], first[2])
    folder, base = posixpath.split(source.name)
    shard_files = [posixpath.join(folder, data_file_name(base, k, num_shards)) for k in range(num_shards)]
    tensors: list[TensorInfo] = []
    findings: list[Finding] = []
    ends = [0] * num_shards
    skipped = {"strings": 0, "training_state": 0, "slices": 0}
    unknown: dict[str, list[str]] = {}
    previous = b""
    for key_bytes, start, end in entries:
        if key_bytes <= previous:
            raise MalformedCheckpoint("tensor bundle index keys are not in ascending order")
        previous = key_bytes
        entry = _entry(wire, start, end)
        if entry.shard >= num_shards:
            raise MalformedCheckpoint(f"entry {key_bytes[:60]!r} is in shard {entry.shard:,} of {num_shards:,}")
        ends[entry.shard] = max(ends[entry.shard], entry.offset + entry.size)
        if key_bytes.startswith(b"\x00"):  # a slice's key is binary (ordered code), not a name
            skipped["slices"] += 1
            continue
        try:  # TensorFlow's Python side decodes every name; one that is not UTF-8 cannot be listed or restored
            key = key_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedCheckpoint(f"variable name {key_bytes[:60]!r} is not UTF-8") from None
        code = DATA_TYPES.get(entry.dtype)
        _check_size(key, code, entry)
        if code == "STRING" or entry.dtype in (20, 21):
            skipped["strings"] += 1
            continue
        if is_training_state(key):
            skipped["training_state"] += 1
            continue
        if code is None:
            code = TF_NAMES.get(entry.dtype, f"DT_{entry.dtype}")
            unknown.setdefault(code, []).append(key)
        tensors.append(TensorInfo(key, code, entry.shape, shard_files[entry.shard], entry.offset,
                                  entry.offset + entry.size, storage=f"crc32c:{entry.crc:08x}"))
    tensors = _tie_keras_export_twins(tensors)
    for code, names in sorted(unknown.items()):
        findings.append(make_finding("CG005", source.name, f"{len(names):,} variable(s) of TensorFlow dtype {code}, "
                                     "which has no dtype code here", tensor=names[0]))
    metadata.update({f"tf.{k}": str(v) for k, v in skipped.items() if v})
    metadata["tf.shard_bytes"] = json.dumps(ends)  # for shard_findings, once the listing is known
    return FileScan(path=source.name, format="tf-bundle", size=source.size, tensors=tuple(tensors),
                    findings=tuple(findings), metadata=metadata, bytes_read=getattr(source, "bytes_read", 0),
                    companions=tuple(posixpath.basename(f) for f in shard_files))


def _tie_keras_export_twins(tensors: list[TensorInfo]) -> list[TensorInfo]:
    """Keras 3's ``model.export`` saves each variable twice: ``variables/N`` (the Keras variables) and
    ``_all_variables/M`` (the TF variables its endpoints use), the same bytes at two offsets.  Tensors
    with such a twin (same crc32c, dtype, shape and shard) become tied aliases, so the set counts them
    once; every other tensor keeps no storage.  (Two equal-valued variables of one shape in such an
    export, such as fresh zero biases, are then counted once.)"""
    def twin_key(t: TensorInfo) -> tuple[object, ...]:
        return (t.storage, t.dtype, t.shape, t.file)

    exported = {twin_key(t) for t in tensors if t.name.startswith("_all_variables/")}
    tracked = {twin_key(t) for t in tensors if not t.name.startswith("_all_variables/")}
    twins = exported & tracked
    return [t._replace(storage_offset=0) if twin_key(t) in twins else t._replace(storage=None) for t in tensors]


def _header(wire: Wire, start: int, end: int) -> tuple[int, dict[str, str]]:
    wire.validate("BundleHeaderProto", start, end, 0)
    num_shards, endianness, producer, min_consumer, bad = 0, 0, 0, 0, []
    for f in wire.fields(start, end, 0):
        if f.wire == VARINT and f.number == 1:
            num_shards = _signed(f.value & 0xFFFFFFFF, 32)
        elif f.wire == VARINT and f.number == 2:
            endianness = f.value
        elif f.wire == LEN and f.number == 3:
            for g in wire.fields(f.value, f.end, 1):
                if g.wire == VARINT and g.number in (1, 2):
                    value = _signed(g.value & 0xFFFFFFFF, 32)
                    producer, min_consumer = (value, min_consumer) if g.number == 1 else (producer, value)
                elif g.wire == VARINT and g.number == 3:
                    bad.append(_signed(g.value & 0xFFFFFFFF, 32))
                elif g.wire == LEN and g.number == 3:
                    bad.extend(_packed(wire, g.value, g.end))
    if not 1 <= num_shards <= MAX_SHARDS:
        raise MalformedCheckpoint(f"tensor bundle header says {num_shards:,} shards")
    if min_consumer > BUNDLE_VERSION or producer < 0 or BUNDLE_VERSION in bad:
        raise MalformedCheckpoint(f"tensor bundle version (producer {producer}, min consumer {min_consumer}) "
                                  "is not readable by TensorFlow's bundle version 1")
    order = {0: "little", 1: "big"}.get(endianness, f"unknown ({endianness})")
    return num_shards, {"tf.num_shards": str(num_shards), "tf.endianness": order}


def _packed(wire: Wire, start: int, end: int) -> list[int]:
    values, pos = [], start
    while pos < end:
        value, pos = wire.varint(pos, end)
        values.append(_signed(value & 0xFFFFFFFF, 32))
    return values


def _entry(wire: Wire, start: int, end: int) -> _Entry:
    wire.validate("BundleEntryProto", start, end, 0)
    entry = _Entry()
    for f in wire.fields(start, end, 0):
        if f.wire == VARINT and f.number == 1:
            entry.dtype = f.value & 0xFFFFFFFF
        elif f.wire == LEN and f.number == 2:
            entry.shape = _shape(wire, f.value, f.end)
        elif f.wire == VARINT and f.number in (3, 4, 5):
            value = _signed(f.value & 0xFFFFFFFF, 32) if f.number == 3 else _signed(f.value)
            if value < 0:
                raise MalformedCheckpoint(f"bundle entry has a negative {('shard id', 'offset', 'size')[f.number - 3]}")
            if f.number == 3:
                entry.shard = value
            elif f.number == 4:
                entry.offset = value
            else:
                entry.size = value
        elif f.wire == FIXED32 and f.number == 6:
            entry.crc = int.from_bytes(wire.win.read(f.value, 4), "little")
        elif f.wire == LEN and f.number == 7:
            entry.sliced = True
    return entry


def _shape(wire: Wire, start: int, end: int) -> tuple[int, ...]:
    dims: list[int] = []
    numel = 1
    for f in wire.fields(start, end, 1):
        if f.wire == VARINT and f.number == 3 and f.value:
            raise MalformedCheckpoint("bundle entry has a shape of unknown rank")
        if f.wire != LEN or f.number != 2:
            continue
        size = 0
        for g in wire.fields(f.value, f.end, 2):
            if g.wire == VARINT and g.number == 1:
                size = _signed(g.value)
        if size < 0 or len(dims) >= MAX_RANK:
            raise MalformedCheckpoint(f"bundle entry has a dimension of {size:,} or more than {MAX_RANK} dimensions")
        numel *= size
        if numel >= 2**63:
            raise MalformedCheckpoint("bundle entry's shape has more than 2^63 elements")
        dims.append(size)
    return tuple(dims)


def _check_size(key: str, code: str | None, entry: _Entry) -> None:
    """A fixed-width tensor's bytes are exactly its elements (a restore refuses anything else)."""
    if code is None or entry.sliced:
        return
    want = dtypes.nbytes(code, _numel(entry.shape))
    if want is not None and want != entry.size:
        raise MalformedCheckpoint(f"entry {shown(key)} is {entry.size:,} bytes, but a {code} tensor of shape "
                                  f"{list(entry.shape)[:8]} needs {want:,}")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def shard_findings(scan: FileScan, sizes: Mapping[str, int | None]) -> list[Finding]:
    """CG004 for each data shard that is missing, or shorter than the entries placed in it."""
    try:
        ends = json.loads(scan.metadata.get("tf.shard_bytes", "[]"))
    except ValueError:
        ends = []
    findings = []
    for name, end in zip(scan.companions, ends):
        size = sizes.get(name)
        if size is None:
            findings.append(make_finding("CG004", scan.path, f"data shard {name!r} of this tensor bundle is missing"))
        elif size < end:
            findings.append(make_finding("CG004", scan.path, f"data shard {name!r} is {size:,} bytes, but the index "
                                         f"places entries up to byte {end:,}: truncated?"))
    return findings
