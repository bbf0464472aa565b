"""Keras 3 ``.keras``: a zip of metadata.json, config.json and model.weights.h5.

Keras 3 writes every member stored (``zipfile.ZipFile`` default), so the h5
member is read in place through a byte-range view: one central-directory read,
the two small JSON members, then the HDF5 object headers.  A deflated
``model.weights.h5`` (re-zipped by another tool) is inflated into memory up to
``MAX_INFLATED_WEIGHTS``; past that it is CG006 (re-save it with Keras).

The model's dtype policy is the declared dtype (``metadata["declared_dtype"]``):
the *variable* dtype of the policy, since that is what the weights hold:
``float32``, ``mixed_float16`` and ``mixed_bfloat16`` all store F32 variables
(the mixed policies only compute in 16 bits); ``bfloat16`` / ``float16`` store
BF16 / F16.  Quantized policies (``QuantizedDTypePolicy``) declare none.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import Counter

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.readers.hdf5 import INSTALL_HINT, have_h5py, walk_hdf5
from guard.readers.torch_zip import ZipEntry, read_zip_directory
from guard.sources import ByteSource, BytesSource
from guard.tensors import FileScan

WEIGHTS_MEMBER = "model.weights.h5"
MAX_ENTRIES = 10_000  # config, metadata, weights and assets/
MAX_JSON = 8 * 1024 * 1024  # a large Keras model's config.json is a few hundred KB
MAX_INFLATED_WEIGHTS = 64 * 1024 * 1024
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
# policy name -> the dtype its variables are stored in
POLICY_VARIABLE_DTYPES: dict[str, str] = {
    "float32": "F32", "mixed_float16": "F32", "mixed_bfloat16": "F32",
    "float16": "F16", "bfloat16": "BF16", "float64": "F64",
}


class MemberSource:
    """A stored zip member as a ByteSource of its own (reads go to the archive)."""

    def __init__(self, parent: ByteSource, start: int, size: int, name: str) -> None:
        self.parent, self.start, self.size, self.name = parent, start, size, name

    def read_at(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise MalformedCheckpoint(
                f"read of {size} bytes at offset {offset} runs past the end of {self.name} ({self.size} bytes)")
        return self.parent.read_at(self.start + offset, size)


def read_keras(source: ByteSource) -> FileScan:
    entries = read_zip_directory(source)
    if len(entries) > MAX_ENTRIES:
        raise MalformedCheckpoint(f"{len(entries):,} zip entries: more than a .keras archive holds")
    metadata = _keras_metadata(source, entries)
    if WEIGHTS_MEMBER not in entries:
        other = "model.weights.npz" if "model.weights.npz" in entries else None
        if other is None:
            raise MalformedCheckpoint(f"no {WEIGHTS_MEMBER} in the .keras archive")
        return _unsupported(source, f"{other} (Keras' npz weights format) is not read; "
                                    "re-save with the default h5 weights", metadata)
    entry = entries[WEIGHTS_MEMBER]
    if not have_h5py():
        return _unsupported(source, f"a .keras archive; reading its {WEIGHTS_MEMBER} needs h5py: "
                                    f"{INSTALL_HINT}", metadata)
    start = _data_offset(source, entry)
    if entry.method == 0:
        view: ByteSource = MemberSource(source, start, entry.size, f"{source.name}!{WEIGHTS_MEMBER}")
    elif max(entry.size, entry.compressed_size) > MAX_INFLATED_WEIGHTS:
        return _unsupported(source, f"{WEIGHTS_MEMBER} is deflated ({entry.size:,} bytes inflated, over the "
                                    f"{MAX_INFLATED_WEIGHTS // 2**20} MiB in-memory bound); Keras writes it "
                                    "stored: re-save the model with Keras", metadata)
    else:
        view = BytesSource(_member_bytes(source, entry, start),
                           name=f"{source.name}!{WEIGHTS_MEMBER}")
    scan = walk_hdf5(view, fmt="keras", path=source.name)
    return FileScan(path=source.name, format="keras", size=source.size, tensors=scan.tensors,
                    findings=scan.findings, metadata={**scan.metadata, **metadata},
                    bytes_read=getattr(source, "bytes_read", 0))


def _unsupported(source: ByteSource, message: str, metadata: dict[str, str]) -> FileScan:
    return FileScan(path=source.name, format=None, size=source.size, metadata=metadata,
                    findings=(make_finding("CG006", source.name, message),),
                    bytes_read=getattr(source, "bytes_read", 0))


def _keras_metadata(source: ByteSource, entries: dict[str, ZipEntry]) -> dict[str, str]:
    out: dict[str, str] = {}
    try:  # informational, and keras.saving.load_model does not read it: a broken one is left out
        meta = _json_member(source, entries["metadata.json"]) if "metadata.json" in entries else None
    except MalformedCheckpoint:
        meta = None
    if isinstance(meta, dict) and isinstance(meta.get("keras_version"), str):
        out["keras_version"] = meta["keras_version"][:50]
    if "config.json" not in entries:
        raise MalformedCheckpoint("no config.json in the .keras archive")
    config = _json_member(source, entries["config.json"])
    if not isinstance(config, dict):
        raise MalformedCheckpoint("config.json is not a JSON object")
    out.update(declared_policy(config))
    return out


def declared_policy(config: dict[str, object]) -> dict[str, str]:
    """declared_dtype / declared_dtype_source (and keras_quantization) from a model config."""
    inner = config.get("config")
    if not isinstance(inner, dict):
        return {}
    where, name = "config.dtype", _policy_name(inner.get("dtype"))
    if name is None:  # Functional models record the policy per layer only
        layers = inner.get("layers")
        names = Counter(
            n for layer in layers if isinstance(layer, dict) and layer.get("class_name") != "InputLayer"
            and isinstance(layer.get("config"), dict) and (n := _policy_name(layer["config"].get("dtype")))
        ) if isinstance(layers, list) else Counter()
        if not names:
            return {}
        where, name = "config.layers[*].config.dtype", names.most_common(1)[0][0]
    if name.startswith("quantized:"):
        return {"keras_quantization": name.removeprefix("quantized:")[:50]}
    code = POLICY_VARIABLE_DTYPES.get(name) or dtypes.parse_dtype_name(name)
    source = f"config.json {where}: Keras dtype policy {name[:50]!r}"
    if code is None:
        return {"declared_dtype_source": source}
    return {"declared_dtype": code, "declared_dtype_source": source}


def _policy_name(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if not isinstance(value, dict) or not isinstance(value.get("config"), dict):
        return None
    cfg = value["config"]
    if value.get("class_name") == "QuantizedDTypePolicy" or "mode" in cfg:
        return f"quantized:{cfg.get('mode')}"
    name = cfg.get("name")
    return name if isinstance(name, str) else None


def _json_member(source: ByteSource, entry: ZipEntry) -> object:
    if max(entry.size, entry.compressed_size) > MAX_JSON:
        raise MalformedCheckpoint(f"{entry.name} declares {entry.size:,} bytes, over the {MAX_JSON:,}-byte limit")
    start, crc = _local_header(source, entry)
    raw = _member_bytes(source, entry, start)
    if crc is not None and zlib.crc32(raw) != crc:  # small members are read whole: check them
        raise MalformedCheckpoint(f"bad CRC-32 for {entry.name}")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedCheckpoint(f"{entry.name} is not valid JSON: {str(exc)[:100]}") from None


def _data_offset(source: ByteSource, entry: ZipEntry) -> int:
    start, _crc = _local_header(source, entry)
    return start


def _local_header(source: ByteSource, entry: ZipEntry) -> tuple[int, int | None]:
    """(data offset, CRC-32 from the local header, None if a data descriptor holds it)."""
    if entry.flags & 0x1:
        raise MalformedCheckpoint(f"zip entry {entry.name!r} is encrypted")
    if entry.method not in (0, 8):
        raise MalformedCheckpoint(f"zip entry {entry.name!r} uses compression method {entry.method}")
    if entry.method == 0 and entry.size != entry.compressed_size:
        raise MalformedCheckpoint(f"stored zip entry {entry.name!r} has two different sizes")
    sig, _v, flags, _m, _t, _d, crc, _cs, _us, nlen, elen = _LOCAL.unpack(
        source.read_at(entry.header_offset, _LOCAL.size))
    if sig != b"PK\x03\x04":
        raise MalformedCheckpoint(f"bad zip local header for {entry.name!r}")
    name = source.read_at(entry.header_offset + _LOCAL.size, nlen).decode("utf-8", "replace")
    if name != entry.name:
        raise MalformedCheckpoint(f"zip entry {entry.name!r} is named {name!r} in its local header")
    start = entry.header_offset + _LOCAL.size + nlen + elen
    if start + entry.compressed_size > source.size:
        raise MalformedCheckpoint(f"zip entry {entry.name!r} runs past the end of the archive")
    return start, None if flags & 0x08 else crc


def _member_bytes(source: ByteSource, entry: ZipEntry, start: int) -> bytes:
    """A member's bytes, inflated to at most its declared size (the callers bound that) + 1 byte:
    a zip bomb that lies about its size stops there (CG001)."""
    data = source.read_at(start, entry.compressed_size)
    if entry.method == 0:
        return data
    inflater = zlib.decompressobj(-15)
    try:
        out = inflater.decompress(data, entry.size + 1)
    except zlib.error as exc:
        raise MalformedCheckpoint(f"cannot inflate {entry.name!r}: {exc}") from None
    if inflater.unconsumed_tail or len(out) != entry.size:
        raise MalformedCheckpoint(f"{entry.name!r} does not inflate to its declared {entry.size:,} bytes")
    return out
