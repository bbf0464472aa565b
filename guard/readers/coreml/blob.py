"""Core ML packages (``.mlpackage``): one set, read from ``Manifest.json`` and the MIL blob storage headers.

A package is a folder: ``Manifest.json`` names its items (``rootModelIdentifier``
and ``itemInfoEntries``, paths under ``Data/``), the root item is the model spec
(``com.apple.CoreML/model.mlmodel``) and an ML program keeps its weights in
``com.apple.CoreML/weights/weight.bin``: MIL blob storage (coremltools
``mlmodel/src/MILBlob/Blob/StorageFormat.hpp``).  That file is a 64-byte header
(u32 count, u32 version 2, reserved) and, per blob, 64-byte aligned, a 64-byte
``blob_metadata`` (u32 sentinel 0xDEADBEEF, u32 ``BlobDataType``, u64 size in
bytes, u64 offset of the data, u64 padding bits of sub-byte types, reserved)
followed by the data.  Each blob is one weight; its name is where the program
finds it (``weight.bin@64``), its shape the element count (the program holds the
real shape, which is not read).  A package without a weights file (a neural
network, or an ML program whose constants are all inline) is CG006 as a whole.
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Callable, Mapping

from guard import dtypes, jsonload
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.readers.binary.window import Window
from guard.readers.coreml.spec import HINT_F16, read_mlmodel
from guard.sources import ByteSource
from guard.tensors import FileScan, TensorInfo

MANIFEST = "Manifest.json"
MAX_MANIFEST = 2**20
SENTINEL = 0xDEADBEEF
ALIGNMENT = 64
HEADER = struct.Struct("<II")
METADATA = struct.Struct("<IIQQQ")  # sentinel, mil_dtype, sizeInBytes, offset, padding_size_in_bits
STORAGE_VERSION = 2
MAX_WEIGHT_FILES = 64
# BlobDataType (MILBlob/Blob/BlobDataType.hpp) -> (code, bits); UInt1/UInt3/UInt6 have no code here
BLOB_TYPES: dict[int, tuple[str, int]] = {
    1: ("F16", 16), 2: ("F32", 32), 3: ("U8", 8), 4: ("I8", 8), 5: ("BF16", 16), 6: ("I16", 16), 7: ("U16", 16),
    8: ("I4", 4), 9: ("coreml:uint1", 1), 10: ("U2", 2), 11: ("U4", 4), 12: ("coreml:uint3", 3),
    13: ("coreml:uint6", 6), 14: ("I32", 32), 15: ("U32", 32), 16: ("F8_E4M3", 8), 17: ("F8_E5M2", 8),
}
# palettized indices and linear-quantized payloads: the package is quantized (coremltools.optimize)
QUANTIZED_BLOBS = frozenset({"U8", "I8", "I4", "U4", "U2", "coreml:uint1", "coreml:uint3", "coreml:uint6"})


def read_mil_blobs(source: ByteSource, *, label: str | None = None) -> list[TensorInfo]:
    """Every blob of one MIL blob storage file, from its metadata records; data is skipped by its size."""
    win = Window(source)
    count, version = HEADER.unpack(win.read(0, 64, "blob storage header")[:8])
    if version != STORAGE_VERSION:
        raise MalformedCheckpoint(f"MIL blob storage version {version} (version {STORAGE_VERSION} is read)")
    if count * 2 * ALIGNMENT > source.size:
        raise MalformedCheckpoint(f"{count:,} blobs cannot fit in {source.size:,} bytes")
    label = label or posixpath.basename(source.name)
    tensors = []
    pos = ALIGNMENT
    for _ in range(count):
        sentinel, mil_dtype, size, offset, padding = METADATA.unpack(win.read(pos, METADATA.size, "blob metadata"))
        if sentinel != SENTINEL:
            raise MalformedCheckpoint(f"blob metadata at offset {pos:,} has no 0xDEADBEEF sentinel")
        if offset < pos + ALIGNMENT or offset + size > source.size:  # the writer aligns; the reader does not ask
            raise MalformedCheckpoint(f"blob at offset {pos:,}: data of {size:,} bytes at {offset:,} is not "
                                      f"after its metadata inside the file ({source.size:,} bytes)")
        code, bits = BLOB_TYPES.get(mil_dtype, (f"coreml:{mil_dtype}", 8))
        if bits < 8 and padding >= 8:  # padding describes sub-byte spans only; the reader ignores it elsewhere
            raise MalformedCheckpoint(f"blob at offset {pos:,}: {padding:,} padding bits")
        numel, rest = divmod(size * 8 - (padding if bits < 8 else 0), bits)
        if rest:
            raise MalformedCheckpoint(f"blob at offset {pos:,}: {size:,} bytes are not whole {code} elements")
        tensors.append(TensorInfo(f"{label}@{pos}", code, (numel,), source.name, offset, offset + size))
        pos = -(-(offset + size) // ALIGNMENT) * ALIGNMENT
    return tensors


def read_mil_blob_file(source: ByteSource) -> FileScan:
    """One weight.bin on its own (fuzzing, tests)."""
    tensors = read_mil_blobs(source)
    return FileScan(path=source.name, format="coreml", size=source.size, tensors=tuple(tensors),
                    bytes_read=getattr(source, "bytes_read", 0))


def read_mlpackage(name: str, files: Mapping[str, int], open_file: Callable[[str], ByteSource]) -> FileScan:
    """A package from its listed files (relative path -> size); ``open_file`` opens only listed ones."""
    size = sum(files.values())
    if MANIFEST not in files:
        raise MalformedCheckpoint("a Core ML package without Manifest.json")
    if files[MANIFEST] > MAX_MANIFEST:
        raise MalformedCheckpoint(f"Manifest.json of {files[MANIFEST]:,} bytes (over {MAX_MANIFEST:,})")
    manifest = open_file(MANIFEST)
    root = _root_model(jsonload.loads(manifest.read_at(0, manifest.size).decode("utf-8")))
    if root not in files:
        raise MalformedCheckpoint(f"the package's root model {root!r} is not in it")
    folder = posixpath.dirname(root)
    weights = sorted(p for p in files if p.startswith(f"{folder}/weights/") and p.endswith(".bin"))
    if len(weights) > MAX_WEIGHT_FILES:
        raise MalformedCheckpoint(f"{len(weights):,} weight files in one package")
    metadata = {"coreml.root_model": root}
    if not weights:  # a neural network keeps its weights in the spec
        spec = read_mlmodel(open_file(root))
        if spec.tensors:
            return spec._replace(path=name, size=size, metadata={**metadata, **spec.metadata})
        finding = make_finding("CG006", name, "Core ML package without a weights file whose model.mlmodel holds no "
                               "neural-network weights (an ML program's inline constants are not read), so the "
                               "package was not scanned")
        return FileScan(path=name, format=None, size=size, findings=(finding,),
                        metadata={**metadata, "unsupported": "Core ML"})
    tensors: list[TensorInfo] = []
    read = 0
    for relative in weights:
        source = open_file(relative)
        tensors += read_mil_blobs(source, label=posixpath.relpath(relative, folder))
        read += getattr(source, "bytes_read", 0)
    codes = {t.dtype for t in tensors}
    if "F16" in codes:
        metadata.update({"compressed": "F16", "compressed.hint": HINT_F16})
    if codes & QUANTIZED_BLOBS:
        metadata["quantization"] = "coreml"
    unknown = sorted(c for c in codes if not dtypes.is_known(c))
    findings = tuple(make_finding("CG005", name, f"Core ML blob type {code.split(':', 1)[1]} is not a dtype this "
                                  "tool knows") for code in unknown if code.split(":", 1)[1].isdigit())
    return FileScan(path=name, format="coreml", size=size, tensors=tuple(tensors), findings=findings,
                    metadata=metadata, bytes_read=read + getattr(manifest, "bytes_read", 0))


def _root_model(manifest: object) -> str:
    entries = manifest.get("itemInfoEntries") if isinstance(manifest, dict) else None
    root_id = manifest.get("rootModelIdentifier") if isinstance(manifest, dict) else None
    entry = entries.get(root_id) if isinstance(entries, dict) and isinstance(root_id, str) else None
    path = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(path, str) or not path:
        raise MalformedCheckpoint("Manifest.json names no root model (rootModelIdentifier, itemInfoEntries)")
    parts = path.replace("\\", "/").split("/")
    if path.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
        raise MalformedCheckpoint(f"Manifest.json's root model {path[:200]!r} is not a path inside the package")
    return posixpath.normpath("Data/" + "/".join(parts))
