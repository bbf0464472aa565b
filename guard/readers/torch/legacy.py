"""torch legacy (non-zip) checkpoints: consecutive pickles, then raw storages.

Layout (torch < 1.6, or ``_use_new_zipfile_serialization=False``): the magic
number, the protocol (1001), ``sys_info``, the object, the list of storage keys;
then per key an 8-byte little-endian element count and the raw bytes.  Every
pickle goes through the static walker (``sys_info`` could hide a global too).
The storages section is walked by its count headers, seeking over the data.
"""

from __future__ import annotations

import struct

from guard.errors import MalformedCheckpoint
from guard.findings import shown
from guard.readers.binary.window import WindowStream
from guard.readers.torch.pickle import (
    ITEMSIZES,
    MAX_PICKLE_BYTES,
    PickleWalker,
    StorageRef,
    TensorRef,
    Unsafe,
    is_hashable,
    kind_of,
)
from guard.readers.torch.tensors import (
    CountingSource,
    storage_dtype,
    storage_from_pid,
    torch_file_scan,
    unsafe_and_unreadable,
)
from guard.sources import ByteSource
from guard.tensors import FileScan

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


def read_torch_legacy(source: ByteSource) -> FileScan:
    counted = CountingSource(source)
    if source.size >= 262 and counted.read_at(257, 5) == b"ustar":
        raise MalformedCheckpoint("legacy tar-format torch checkpoint is not supported")
    roots: dict[str, StorageRef] = {}  # root key -> the storage its first persistent id made
    made: dict[object, StorageRef] = {}  # torch.load's table: root and view keys alike
    zip_form_ids = 0

    def persistent_load(pid: object) -> object:
        nonlocal zip_form_ids
        if isinstance(pid, tuple) and len(pid) >= 2 and pid[0] in ("module", b"module"):
            # torch.save(model) before 1.6: ('module', class, source file, source) per nn.Module
            # class; torch.load returns the class (CG003 already names it), weights_only refuses it
            return pid[1]
        if isinstance(pid, tuple) and len(pid) == 5:
            # the zip form: torch.load's legacy loader refuses it ("not enough values to unpack"),
            # and so does the scan, once the walk has gone on to name any global after it (CG003)
            zip_form_ids += 1
            return Unsafe("a 5-tuple persistent id")
        return _legacy_storage(pid, roots, made)

    walker = PickleWalker(persistent_load)
    limit = min(source.size, MAX_PICKLE_BYTES)
    stream = WindowStream(counted, 0, limit)  # read ahead from 64 KiB: a typical pickle is one read
    try:
        if walker.walk(stream) != LEGACY_MAGIC:
            raise MalformedCheckpoint("legacy torch magic number is wrong")
        if walker.walk(stream) != LEGACY_PROTOCOL:
            raise MalformedCheckpoint("legacy torch protocol version is not 1001")
        walker.walk(stream)  # sys_info: torch.load reads it and looks at nothing in it
        root = walker.walk(stream)
        if zip_form_ids:
            raise MalformedCheckpoint(f"{zip_form_ids} persistent id(s) of 5 items, the zip form: "
                                      "a legacy storage id has 6 (its view last)")
        keys = walker.walk(stream)
        storages = {key: ref.dtype for key, ref in roots.items()}
        declared = {key: ref.nbytes for key, ref in roots.items()}
        spans = _declared_spans(counted, stream.tell(), _key_list(keys), storages, declared) \
            or _storage_spans(counted, stream.tell(), _key_list(keys), storages)
        return torch_file_scan(source, "torch-legacy", walker, root, lambda storage: _span(spans, storage),
                               bytes_read=counted.bytes_read, storages=len(spans))
    except MalformedCheckpoint as exc:
        if not walker.unsafe:
            raise
        return unsafe_and_unreadable(source, "torch-legacy", walker, exc, counted.bytes_read)


def _legacy_storage(pid: object, roots: dict[str, StorageRef], made: dict[object, StorageRef]
                    ) -> StorageRef | Unsafe:
    """torch.load's legacy ``persistent_load``, described: ``('storage', class, root key, location,
    element count, view)``, the view None or ``(view key, offset, size)`` in elements.

    The first id of a root key makes its storage; a later id of that key gets the same storage
    back whatever count it states (torch.load still multiplies it, unused); the first view made
    under a view key is the one every later id of that key gets.
    """
    if not isinstance(pid, tuple) or len(pid) != 6:
        raise MalformedCheckpoint("persistent id is not a 6-tuple ('storage', class, key, location, count, view)")
    if pid[0] not in ("storage", b"storage"):
        kind = shown(pid[0]) if isinstance(pid[0], str) else kind_of(pid[0])
        raise MalformedCheckpoint(f"persistent id of kind {kind}: torch loads only storages")
    key, count, view = pid[2], pid[4], pid[5]
    if not is_hashable(key):
        raise MalformedCheckpoint(f"storage key is {kind_of(key)}, which is unhashable")
    storage = made.get(key)
    if storage is None:
        if type(key) is not str:
            # the storage list holds strings: torch.load leaves this storage uninitialised memory
            raise MalformedCheckpoint(
                f"storage keyed by {kind_of(key)}, not a string, is missing from the storage list")
        first = storage_from_pid(pid[:5])
        if isinstance(first, Unsafe):
            return first
        storage = roots[key] = made[key] = first
    dtype = storage_dtype(pid[1])
    if isinstance(dtype, Unsafe):
        return dtype
    if not _multipliable(count):
        raise MalformedCheckpoint("persistent id has a bad storage key or element count")
    if roots[storage.key].nbytes == 0:  # torch.load gives an empty storage a fresh one of this id's class
        storage = StorageRef(storage.key, dtype, 0)
    return storage if view is None else _legacy_view(view, storage, dtype, made)


def _legacy_view(view: object, root: StorageRef, dtype: str, made: dict[object, StorageRef]) -> StorageRef:
    """torch.load slices the root's bytes ``[offset : offset + size]`` (elements of this id's class)
    as Python slices: a slice past the end is shorter or empty, a negative bound counts from the end."""
    if not (isinstance(view, tuple) and len(view) == 3 and is_hashable(view[0])
            and all(_multipliable(v) for v in view[1:])):
        raise MalformedCheckpoint("persistent id has a malformed storage view")
    view_key, offset, size = view
    if view_key in made:
        return made[view_key]
    if not all(isinstance(v, int) for v in (offset, size)):
        raise MalformedCheckpoint("persistent id has a malformed storage view")
    itemsize = ITEMSIZES[dtype]
    start, stop, _ = slice(offset * itemsize, (offset + size) * itemsize).indices(root.nbytes)
    made[view_key] = StorageRef(root.key, dtype, max(0, stop - start), root.view_offset + start)
    return made[view_key]


def _multipliable(value: object) -> bool:
    # torch.load computes ``count * element_size`` and ``offset * element_size`` on every id
    return isinstance(value, (int, float, str, bytes, list, tuple, TensorRef))


def _key_list(keys: object) -> list[str]:
    if isinstance(keys, Unsafe):
        raise MalformedCheckpoint("legacy torch storage key list is not a list")
    if not isinstance(keys, list) or not all(isinstance(k, (str, bytes)) for k in keys):
        raise MalformedCheckpoint("legacy torch storage key list is not a list of strings")
    return [k.decode("latin-1") if isinstance(k, bytes) else k for k in keys]


def _declared_spans(source: ByteSource, offset: int, keys: list[str], storages: dict[str, str],
                    declared: dict[str, int]) -> dict[str, tuple[int, int]] | None:
    """Spans from the sizes the pickle declares, reading only the first count header.

    Valid when they tile the rest of the file exactly (what torch writes); a remote
    scan then costs no request per storage.  None sends the caller to the header walk.
    """
    spans: dict[str, tuple[int, int]] = {}
    pos = offset
    for key in keys:
        if key not in storages:
            return None
        spans[key] = (pos + 8, pos + 8 + declared[key])
        pos += 8 + declared[key]
    if pos != source.size:
        return None
    if keys:
        (count,) = struct.unpack("<q", source.read_at(offset, 8))
        if count * ITEMSIZES[storages[keys[0]]] != declared[keys[0]]:
            return None
    return spans


def _storage_spans(source: ByteSource, offset: int, keys: list[str], storages: dict[str, str]
                   ) -> dict[str, tuple[int, int]]:
    """Key -> absolute (start, end) of its bytes, seeking from one count header to the next."""
    spans: dict[str, tuple[int, int]] = {}
    pos = offset
    for key in keys:
        if key not in storages:
            raise MalformedCheckpoint(f"storage {key!r} is listed but no tensor uses it")
        (count,) = struct.unpack("<q", source.read_at(pos, 8))
        end = pos + 8 + count * ITEMSIZES[storages[key]]
        if count < 0 or end > source.size:
            raise MalformedCheckpoint(f"storage {key!r} runs past the end of the file (truncated?)")
        spans[key] = (pos + 8, end)
        pos = end
    return spans


def _span(spans: dict[str, tuple[int, int]], storage: StorageRef) -> tuple[int, int]:
    span = spans.get(storage.key)
    if span is None:
        raise MalformedCheckpoint(f"storage {storage.key!r} is missing from the storage list")
    return span
