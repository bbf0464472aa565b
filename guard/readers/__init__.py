"""Readers: one pure parser per format over a ByteSource, and the dispatcher that turns any
parse failure into CG001.

The tree shows what reads what: a folder per family (``torch/``, ``onnx/``, ``coreml/``, ``tf/``,
``hdf5/``, ``gguf/``), single-module formats beside them (``safetensors``, ``flax_msgpack``,
``numpy_files``, ``orbax``, ``openvino``, ``lfs``), and the byte machinery they share in ``binary/``
(forward windows, zip directories, protobuf and flatbuffers walkers).

Each reader takes a ``ByteSource`` (local or remote alike) and returns a ``FileScan``
built from headers only.  May import sources, tensors, dtypes, findings and the
catalogue; never the inventory, rules, report or CLI, and no heavy library on a
scan's path (an optional parser is imported by its reader, when its format is seen).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.lazy import resolve
from guard.readers.lfs import is_lfs_pointer
from guard.sources import ByteSource
from guard.tensors import FileScan

Reader = Callable[[ByteSource], FileScan]

# format -> "module:function"; a reader's module is imported the first time a file of its
# format is seen, so a scan of safetensors files never loads the pickle or msgpack machinery.
READERS: dict[str, str] = {
    "safetensors": "guard.readers.safetensors:read_safetensors",
    "torch-zip": "guard.readers.torch.zip:read_torch_zip",
    "torch-legacy": "guard.readers.torch.legacy:read_torch_legacy",
    "torch-export": "guard.readers.torch.export:read_torch_export",  # reached through torch-zip's dispatch
    "flax-msgpack": "guard.readers.flax_msgpack:read_flax_msgpack",
    "lfs-pointer": "guard.readers.lfs:read_lfs_pointer",
    # HDF5 / Keras / Orbax; h5py and tensorstore load only inside these readers
    "hdf5": "guard.readers.hdf5.file:read_hdf5",
    "keras": "guard.readers.hdf5.keras:read_keras",
    "gguf": "guard.readers.gguf.file:read_gguf",
    "onnx": "guard.readers.onnx.graph:read_onnx",
    "npy": "guard.readers.numpy_files:read_npy",
    "npz": "guard.readers.numpy_files:read_npz",
    "tf-bundle": "guard.readers.tf.bundle:read_tf_bundle",  # the .index; its data shards are companions
    "tflite": "guard.readers.tf.tflite:read_tflite",
    "openvino": "guard.readers.openvino:read_openvino",  # the .xml; its .bin is a companion
    # a weight.bin alone; packages: guard.inventory.package_dirs
    "coreml": "guard.readers.coreml.blob:read_mil_blob_file",
    "coreml-spec": "guard.readers.coreml.spec:read_mlmodel",  # .mlmodel: neural-network WeightParams
    "executorch": "guard.readers.torch.executorch:read_executorch",
}


def reader_for(fmt: str) -> Reader:
    reader: Reader = resolve(READERS[fmt])
    return reader


# Failures a reader may hit on hostile bytes; every one becomes CG001, never a traceback.
READ_FAILURES: tuple[type[BaseException], ...] = (
    MalformedCheckpoint,
    ValueError,  # includes UnicodeDecodeError and json.JSONDecodeError
    struct.error,
    RecursionError,
    OverflowError,
    EOFError,
    IndexError,
    KeyError,
    TypeError,
)

_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = bytes.fromhex("8a0a6cfc9c46f9206aa850192e")  # LONG1 0x1950a86a20f9469cfc6c, STOP
_GGUF_MAGIC = b"GGUF"
_NPY_MAGIC = b"\x93NUMPY"
_MIL_BLOB_SENTINEL = b"\xef\xbe\xad\xde"
_TABLE_MAGIC = bytes.fromhex("57fb808b247547db")  # LevelDB table footer (TF bundle index)

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_HDF5_SUFFIXES = (".h5", ".hdf5")


def sniff_format(source: ByteSource) -> str | None:
    """The format of a file from its first bytes (and its name as a tie-break)."""
    head = source.read_at(0, min(source.size, 512))
    if is_lfs_pointer(head):
        return "lfs-pointer"
    name = source.name.lower()
    # a .keras archive is a zip too, but never a torch checkpoint; HDF5 by magic or suffix
    # (a user block moves the signature to 512, 1024, ...: the suffix decides, the reader checks)
    if name.endswith(".keras"):
        return "keras"
    if name.endswith(".xml"):
        return "openvino"  # an IR's .xml is text, never another format's file
    if head.startswith(_HDF5_MAGIC) or name.endswith(_HDF5_SUFFIXES):
        return "hdf5"
    if head.startswith(_GGUF_MAGIC):
        return "gguf"
    if head[4:8] == b"ET12" or name.endswith(".pte"):
        return "executorch"  # a flatbuffer's file identifier; the reader explains another one
    if head[4:8] == b"TFL3":
        return "tflite"  # a flatbuffer's file identifier
    if name.endswith(".index") and source.size >= 48 and source.read_at(source.size - 8, 8) == _TABLE_MAGIC:
        return "tf-bundle"  # a LevelDB table: its magic is the last 8 bytes
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if name.endswith(".npz") and (head.startswith(_ZIP_MAGIC) or head.startswith(b"PK\x05\x06")):
        return "npz"  # a zip of .npy members, not a torch checkpoint
    if head.startswith(_ZIP_MAGIC) or (source.size == 22 and head.startswith(b"PK\x05\x06")):
        return "torch-zip"
    if head[4:8] == b"\x02\0\0\0" and head[64:68] == _MIL_BLOB_SENTINEL:
        return "coreml"  # MIL blob storage (a Core ML package's weight.bin): version 2, then 0xDEADBEEF
    if _is_legacy_torch(head) or head[257:262] == b"ustar":
        return "torch-legacy"  # the legacy reader explains the old tar variant itself
    if name.endswith(".onnx"):
        return "onnx"  # protobuf has no magic bytes
    if name.endswith(".mlmodel"):
        return "coreml-spec"  # a Core ML spec: protobuf too
    if name.endswith(".msgpack"):
        return "flax-msgpack"
    if name.endswith(".safetensors"):
        return "safetensors"
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    return None


def _is_legacy_torch(head: bytes) -> bool:
    """The magic number pickled at protocol 2 or 3 (torch's), or 4-5 (after a FRAME)."""
    if head[:1] != b"\x80" or head[1:2] not in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return False
    body = head[11:] if head[1] >= 4 and head[2:3] == b"\x95" else head[2:]
    return body.startswith(_LEGACY_MAGIC)


def scan_file(source: ByteSource) -> FileScan:
    """Read one checkpoint file's headers.  Never raises for a problem in the file."""
    try:
        fmt = sniff_format(source)
        if fmt is None:
            raise MalformedCheckpoint("not a weight file of a format read here (safetensors, torch, Flax msgpack, "
                                      "GGUF, ONNX, NumPy, HDF5/Keras, Orbax) nor an LFS pointer")
        return reader_for(fmt)(source)
    except READ_FAILURES as exc:
        return unreadable(source, exc)


def unreadable(source: ByteSource, exc: BaseException | str) -> FileScan:
    reason = exc if isinstance(exc, str) else _describe(exc)
    finding = make_finding("CG001", source.name, f"unreadable checkpoint: {reason}")
    return FileScan(
        path=source.name, format=None, size=source.size, findings=(finding,),
        bytes_read=getattr(source, "bytes_read", 0),
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "structure nested too deeply"
    text = str(exc) or type(exc).__name__
    text = text.splitlines()[0] if text.strip() else type(exc).__name__
    return text[:300]
