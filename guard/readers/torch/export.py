"""torch.export archives (``torch.export.save``, ``.pt2``): tensors from the weights and constants configs.

A pt2 archive is a torch zip (one top folder, ``archive_format`` reading ``pt2``)
without ``data.pkl``.  Per model ``models/<name>.json`` holds the graph, and
``data/weights/<name>_weights_config.json`` / ``data/constants/<name>_constants_config.json``
map each state-dict or constant name to a ``PayloadMeta``: ``path_name`` (the member
that holds its raw storage bytes, shared by tied weights), ``use_pickle`` and
``tensor_meta`` (``dtype`` as a ``torch/_export/serde/schema.py`` ScalarType code,
``sizes``, ``strides``, ``storage_offset``).  Those configs are all a scan reads:
the graph is not parsed.  Each tensor is checked as ``torch.export.load`` builds it
(``as_strided`` over a record of whole elements); a ``path_name`` that is not a
plain member name of its folder is refused, so a config cannot point elsewhere.

``torch.export.load`` also unpickles, with ``weights_only=False``, the sample inputs
(after a ``weights_only=True`` try), tensor subclasses saved with ``use_pickle`` and
``opaque_obj_*`` constants: each is walked as the torch readers walk a pickle, and
a global outside the allowlist is CG003 naming the member.  Nothing is executed.
"""

from __future__ import annotations

import io
import json
import posixpath
import zlib

from guard import jsonload
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding
from guard.readers.binary.zipdir import (
    MemberSource,
    ZipArchive,
    ZipEntry,
    open_member,
    read_member,
    read_zip_archive,
)
from guard.readers.torch.pickle import ITEMSIZES, MAX_PICKLE_BYTES, PickleWalker, StorageRef, TensorRef
from guard.readers.torch.records import (
    MAX_SMALL_RECORD,
    _check_version as check_version,
    check_directory,
    refuse_case_twins,
)
from guard.readers.torch.tensors import (
    CountingSource,
    build_tensor_infos,
    storage_from_pid,
    unsafe_findings,
)
from guard.sources import ByteSource, BytesSource, LocalFile
from guard.tensors import FileScan, TensorInfo

LEGACY_PROGRAM, LEGACY_STATE = "serialized_exported_program.json", "serialized_state_dict.pt"
LEGACY_CONSTANTS, LEGACY_INPUTS = "serialized_constants.pt", "serialized_example_inputs.pt"
MAX_CONFIG = 64 * 1024 * 1024  # ~400 bytes per tensor: 100,000+ tensors
MAX_TENSORS = 1_000_000
NESTED_IN_MEMORY = 4 * 1024 * 1024  # a torch.save file inside a local archive up to this size is read whole
# torch/_export/serde/schema.py ScalarType -> torch dtype name (UNKNOWN = 0 is refused by torch too)
SCALAR_TYPES: dict[int, str] = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32", 8: "float64",
    9: "complex32", 10: "complex64", 11: "complex128", 12: "bool", 13: "bfloat16", 28: "uint16",
    29: "float8_e4m3fn", 30: "float8_e5m2", 31: "float8_e4m3fnuz", 32: "float8_e5m2fnuz", 33: "float8_e8m0fnu",
    34: "uint32", 35: "uint64",
}


def is_export_archive(entries: dict[str, ZipEntry]) -> bool:
    """A torch.export archive: pt2 (``<folder>/archive_format``) or torch 2.7's top-level layout."""
    first = next(iter(entries), "")
    prefix = first.split("/", 1)[0]
    if "/" in first and f"{prefix}/archive_format" in entries:
        return f"{prefix}/data.pkl" not in entries
    return LEGACY_PROGRAM in entries and LEGACY_STATE in entries


def read_torch_export(source: ByteSource) -> FileScan:
    counted = CountingSource(source)
    archive = read_zip_archive(counted)
    if not is_export_archive(archive.entries):
        raise MalformedCheckpoint("zip has no archive_format record: not a torch.export archive")
    return read_export_archive(source, counted, archive)


def read_export_archive(source: ByteSource, counted: CountingSource, archive: ZipArchive) -> FileScan:
    """The tensors of every model in the archive (``counted`` wraps ``source`` and has read ``archive``)."""
    found = _Found()
    try:
        if LEGACY_PROGRAM in archive.entries:
            _read_legacy(counted, archive.entries, found)
        else:
            unsupported = _read_pt2(source, counted, archive, found)
            if unsupported is not None:
                return FileScan(path=source.name, format=None, size=source.size, bytes_read=counted.bytes_read,
                                findings=(make_finding("CG006", source.name, unsupported),))
        tensors, dtype_findings = build_tensor_infos(iter(found.refs), file=source.name, locate=found.spans.get)
        findings = (*found.unsafe, *dtype_findings)
    except MalformedCheckpoint as exc:
        if not found.unsafe:
            raise
        tensors, findings = (), (*found.unsafe, make_finding("CG001", source.name, f"unreadable checkpoint: {exc}"))
    return FileScan(path=source.name, format="torch-export", size=source.size,
                    tensors=(*tensors, *found.legacy), findings=findings, bytes_read=counted.bytes_read,
                    metadata={"pickle_globals": " ".join(sorted(set(found.globals)))} if found.globals else {})


class _Found:
    """What the configs and the walked pickles gave."""

    def __init__(self) -> None:
        self.refs: list[tuple[str, TensorRef]] = []
        self.spans: dict[StorageRef, tuple[int, int]] = {}
        self.unsafe: list[Finding] = []
        self.globals: list[str] = []
        self.legacy: list[TensorInfo] = []


def _read_pt2(source: ByteSource, counted: CountingSource, archive: ZipArchive, found: _Found) -> str | None:
    """Fill ``found`` from every model's configs; a CG006 message for an archive without a program."""
    entries = archive.entries
    prefix = next(iter(entries)).split("/", 1)[0]
    cheap = isinstance(source, (LocalFile, BytesSource))  # one read per record costs little here only
    fmt = read_member(counted, entries[f"{prefix}/archive_format"], limit=64)
    if fmt != b"pt2":
        raise MalformedCheckpoint(f"archive_format record is {fmt[:20]!r}, not 'pt2'")
    check_directory(archive, prefix, source.size)
    # torch's archive reader reads the version record and the serialization id (as bytes) when it
    # opens the archive; byteorder and the rest only torch.load reads
    version = entries.get(f"{prefix}/.data/version") or entries.get(f"{prefix}/version")
    if version is None:
        raise MalformedCheckpoint("zip has no version record: not a torch archive")
    check_version(read_member(counted, version, limit=MAX_SMALL_RECORD))
    if f"{prefix}/.data/serialization_id" in entries:
        read_member(counted, entries[f"{prefix}/.data/serialization_id"], limit=MAX_SMALL_RECORD)
    models = sorted(name[len(f"{prefix}/models/"):-5] for name in entries
                    if name.startswith(f"{prefix}/models/") and name.endswith(".json"))
    if not models:
        if any(name.startswith(f"{prefix}/data/aotinductor/") for name in entries):
            return ("an AOTInductor package (torch._inductor.aoti_compile_and_package): its compiled "
                    "weights are not read")
        raise MalformedCheckpoint("pt2 archive holds no models/<name>.json: no exported program")
    for model in models:
        named = f"{model}." if len(models) > 1 else ""
        sample = entries.get(f"{prefix}/data/sample_inputs/{model}.pt")
        if sample is None:  # torch.export.load reads it before the weights
            refuse_case_twins(entries, (f"{prefix}/data/sample_inputs/{model}.pt",))
            raise MalformedCheckpoint(f"pt2 archive has no data/sample_inputs/{model}.pt")
        _walk_member(counted, sample, found, cheap=cheap)
        for folder in ("weights", "constants"):
            config = _config(counted, entries, f"{prefix}/data/{folder}/{model}_{folder}_config.json")
            for fqn, meta in config.items():
                ref, pickled = _payload(entries, prefix, folder, fqn, meta)
                if ref is not None:
                    found.refs.append((named + fqn, ref))
                if pickled is not None:
                    _walk_member(counted, entries[pickled], found, cheap=cheap, raw_pickle=folder == "constants")
            if len(found.refs) > MAX_TENSORS:
                raise MalformedCheckpoint(f"more than {MAX_TENSORS:,} tensors in the configs")
    if cheap:
        found.spans = _locate(counted, entries, prefix, found.refs)
    return None


def _read_legacy(source: ByteSource, entries: dict[str, ZipEntry], found: _Found) -> None:
    """torch 2.7's layout: the state dict and constants are torch.save files inside the zip."""
    for name in (LEGACY_INPUTS, LEGACY_STATE, LEGACY_CONSTANTS):
        if name in entries:
            scan = _walk_member(source, entries[name], found, cheap=False)
            if name != LEGACY_INPUTS:
                found.legacy.extend(t._replace(file=source.name, data_start=None, data_end=None)
                                    for t in scan.tensors)


def _config(source: ByteSource, entries: dict[str, ZipEntry], name: str) -> dict[str, object]:
    entry = entries.get(name)
    if entry is None:
        refuse_case_twins(entries, (name,))
        raise MalformedCheckpoint(f"pt2 archive has no {name.split('/', 1)[1]}")
    raw = read_member(source, entry, limit=MAX_CONFIG)
    if zlib.crc32(raw) != entry.crc:  # read whole anyway: a flipped dtype digit is a corrupted file
        raise MalformedCheckpoint(f"{entry.name!r} does not match its CRC-32: the file is corrupted")
    try:
        config = jsonload.loads(raw.decode("utf-8"))  # torch decodes the record as UTF-8 text
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedCheckpoint(f"{entry.name!r} is not valid JSON: {str(exc)[:100]}") from None
    inner = config.get("config") if isinstance(config, dict) else None
    if not isinstance(inner, dict):
        raise MalformedCheckpoint(f"{entry.name!r} is not a payload config ({{'config': {{...}}}})")
    return inner


def _payload(entries: dict[str, ZipEntry], prefix: str, folder: str, fqn: str, meta: object
             ) -> tuple[TensorRef | None, str | None]:
    """(the tensor a PayloadMeta describes, or None; the member to walk as a pickle, or None)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("path_name"), str):
        raise MalformedCheckpoint(f"{folder} config entry {fqn[:100]!r} has no path_name")
    path_name: str = meta["path_name"]
    if (not path_name or "/" in path_name or "\\" in path_name or path_name in (".", "..")
            or posixpath.isabs(path_name) or "\0" in path_name):
        raise MalformedCheckpoint(f"{folder} config entry {fqn[:100]!r} names {path_name[:100]!r}, "
                                  f"which is not a file of the archive's data/{folder}/ folder")
    member = f"{prefix}/data/{folder}/{path_name}"
    entry = entries.get(member)
    if entry is None:
        refuse_case_twins(entries, (member,))  # torch would find it under another case: say so
        raise MalformedCheckpoint(f"{folder} config entry {fqn[:100]!r} names data/{folder}/{path_name[:100]}, "
                                  "which the archive does not hold")
    use_pickle = meta.get("use_pickle", False)
    if not isinstance(use_pickle, bool):
        raise MalformedCheckpoint(f"{folder} config entry {fqn[:100]!r} has a use_pickle that is not a bool")
    if folder == "constants" and not path_name.startswith("tensor_"):
        if path_name.startswith("opaque_obj_"):  # pickle.loads
            return None, member
        if path_name.startswith("custom_obj_"):  # a TorchScript object: torch's own unpickler, no globals
            return None, None
        raise MalformedCheckpoint(f"constant {fqn[:100]!r} is in {path_name[:100]!r}, "
                                  "a kind of constant torch.export.load does not know")
    ref = _tensor(fqn, meta.get("tensor_meta"), None if use_pickle else entry)
    return ref, member if use_pickle else None


def _tensor(fqn: str, meta: object, entry: ZipEntry | None) -> TensorRef:
    """A TensorRef as ``torch.as_strided`` builds it over the record ``entry`` (None: pickled)."""
    if not isinstance(meta, dict):
        raise MalformedCheckpoint(f"{fqn[:100]!r} has no tensor_meta")
    code = meta.get("dtype")
    dtype = SCALAR_TYPES.get(code) if type(code) is int else None
    if dtype is None:
        raise MalformedCheckpoint(f"{fqn[:100]!r} has dtype code {str(code)[:20]}, not a ScalarType torch loads")
    shape = _ints(fqn, "sizes", meta.get("sizes"))
    stride = _ints(fqn, "strides", meta.get("strides"))
    offset = meta.get("storage_offset", {"as_int": 0})
    offset = offset.get("as_int") if isinstance(offset, dict) else None
    if len(stride) != len(shape) or type(offset) is not int or offset < 0:
        raise MalformedCheckpoint(f"{fqn[:100]!r} has strides or a storage offset that do not fit its sizes")
    itemsize = ITEMSIZES[dtype]
    if entry is None:
        return TensorRef(None, 0, shape, stride, dtype)
    if entry.size % itemsize:
        raise MalformedCheckpoint(f"record {entry.name!r} of {entry.size:,} bytes is not whole {dtype} elements")
    numel = entry.size // itemsize
    if not entry.size:  # torch builds zeros of the tensor's size for an empty record
        numel = 1
        for n in shape:
            numel *= n
    extent = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    if extent and offset + extent > numel:
        raise MalformedCheckpoint(f"{fqn[:100]!r} ({list(shape)} from element {offset}) runs past its "
                                  f"record {entry.name!r} of {numel:,} elements")
    storage = StorageRef(entry.name.split("/", 2)[2], dtype, entry.size)  # "weights/weight_0": one per record
    return TensorRef(storage, offset, shape, stride, dtype)


def _ints(fqn: str, field: str, values: object) -> tuple[int, ...]:
    """A list of ``{"as_int": n}`` (a symbolic ``as_expr`` never describes a stored weight)."""
    if not isinstance(values, list):
        raise MalformedCheckpoint(f"{fqn[:100]!r} has no tensor_meta.{field}")
    out = []
    for value in values:
        n = value.get("as_int") if isinstance(value, dict) else None
        if type(n) is not int or n < 0:
            raise MalformedCheckpoint(f"{fqn[:100]!r} has a tensor_meta.{field} that is not non-negative integers")
        out.append(n)
    return tuple(out)


def _walk_member(source: ByteSource, entry: ZipEntry, found: _Found, *, cheap: bool,
                 raw_pickle: bool = False) -> FileScan:
    """Walk a member that torch.export.load unpickles (a torch.save file, or a bare pickle): its
    refused globals are CG003 naming the member; a member torch could not load makes the file CG001."""
    from guard.readers import scan_file

    name = entry.name.split("/", 1)[1] if "/" in entry.name else entry.name
    shown_name = f"{source.name}!{name}"
    if entry.method == 0 and not (cheap and entry.size <= NESTED_IN_MEMORY):
        member: ByteSource = MemberSource(source, open_member(source, entry), entry.size, shown_name)
    else:  # in memory, the torch zip reader checks the member's records as torch.load reads them
        member = BytesSource(read_member(source, entry, limit=MAX_PICKLE_BYTES), name=shown_name)
    if raw_pickle:
        walker = PickleWalker(storage_from_pid)
        try:
            walker.walk(io.BytesIO(member.read_at(0, min(member.size, MAX_PICKLE_BYTES))))
        finally:
            found.unsafe.extend(make_finding("CG003", source.name, f"{name}: {f.message}")
                                for f in unsafe_findings(walker, source.name))
            found.globals.extend(walker.unsafe)
        return FileScan(path=shown_name, format=None, size=member.size)
    if member.read_at(0, min(4, member.size)) == b"PK\x03\x04" and is_export_archive(read_zip_archive(member).entries):
        raise MalformedCheckpoint(f"{name} is a torch.export archive, not the torch.save file torch.load reads")
    scan = scan_file(member)
    found.unsafe.extend(make_finding("CG003", source.name, f"{name}: {f.message}")
                        for f in scan.findings if f.code == "CG003")
    found.globals.extend(scan.metadata.get("pickle_globals", "").split())
    broken = next((f for f in scan.findings if f.code == "CG001"), None)
    if broken is not None:
        raise MalformedCheckpoint(f"{name}: {broken.message}")
    return scan


def _locate(source: ByteSource, entries: dict[str, ZipEntry], prefix: str,
            refs: list[tuple[str, TensorRef]]) -> dict[StorageRef, tuple[int, int]]:
    """Absolute (start, end) of each stored record that a tensor reads: one local-header read per record."""
    spans: dict[StorageRef, tuple[int, int]] = {}
    for _name, ref in refs:
        storage = ref.storage
        if storage is None or storage in spans:
            continue
        entry = entries[f"{prefix}/data/{storage.key}"]
        start = open_member(source, entry)
        if entry.method == 0:
            spans[storage] = (start, start + entry.size)
    return spans


__all__ = ["SCALAR_TYPES", "TensorInfo", "is_export_archive", "read_export_archive", "read_torch_export"]
