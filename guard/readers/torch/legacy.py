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
from guard.readers.torch.pickle import (
    ITEMSIZES,
    MAX_PICKLE_BYTES,
    DictDesc,
    PickleWalker,
    StorageRef,
    Unsafe,
)
from guard.readers.torch.tensors import (
    CountingSource,
    storage_from_pid,
    torch_file_scan,
    unsafe_and_unreadable,
)
from guard.readers.binary.window import WindowStream
from guard.sources import ByteSource
from guard.tensors import FileScan

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


def read_torch_legacy(source: ByteSource) -> FileScan:
    counted = CountingSource(source)
    if source.size >= 262 and counted.read_at(257, 5) == b"ustar":
        raise MalformedCheckpoint("legacy tar-format torch checkpoint is not supported")
    storages: dict[str, str] = {}  # key -> torch dtype of its elements
    declared: dict[str, int] = {}  # key -> bytes of the root storage, as its persistent id says
    views: dict[object, StorageRef] = {}  # view key -> the view torch.load made the first time

    def persistent_load(pid: object) -> object:
        if isinstance(pid, tuple) and len(pid) >= 2 and pid[0] in ("module", b"module"):
            # torch.save(model) before 1.6: ('module', class, source file, source) per nn.Module
            # class; torch.load returns the class (CG003 already names it), weights_only refuses it
            return pid[1]
        ref = storage_from_pid(pid)
        if isinstance(ref, StorageRef):
            storages.setdefault(ref.key, ref.dtype)
            declared.setdefault(ref.key, pid[4] * ITEMSIZES[ref.dtype])  # type: ignore[index]
            view = pid[5] if len(pid) == 6 else None  # type: ignore[arg-type]
            if isinstance(view, tuple) and isinstance(view[0], (str, bytes, int)):
                # torch.load keeps the first view it made under a view key
                ref = views.setdefault(view[0], ref)
        return ref

    walker = PickleWalker(persistent_load)
    limit = min(source.size, MAX_PICKLE_BYTES)
    stream = WindowStream(counted, 0, limit)  # read ahead from 64 KiB: a typical pickle is one read
    try:
        if walker.walk(stream) != LEGACY_MAGIC:
            raise MalformedCheckpoint("legacy torch magic number is wrong")
        if walker.walk(stream) != LEGACY_PROTOCOL:
            raise MalformedCheckpoint("legacy torch protocol version is not 1001")
        if not isinstance(walker.walk(stream), DictDesc):
            raise MalformedCheckpoint("legacy torch sys_info is not a dict")
        root = walker.walk(stream)
        keys = walker.walk(stream)
        spans = _declared_spans(counted, stream.tell(), _key_list(keys), storages, declared) \
            or _storage_spans(counted, stream.tell(), _key_list(keys), storages)
        return torch_file_scan(source, "torch-legacy", walker, root, lambda storage: _span(spans, storage),
                               bytes_read=counted.bytes_read, storages=len(spans))
    except MalformedCheckpoint as exc:
        if not walker.unsafe:
            raise
        return unsafe_and_unreadable(source, "torch-legacy", walker, exc, counted.bytes_read)


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
