"""torch zip checkpoints (.bin/.pt/.pth): the zip directory and data.pkl, nothing else.

A scan reads the End Of Central Directory (one small read at the tail, a wider
one only if the zip has a comment), the central directory, and the local
header plus bytes of ``<prefix>/data.pkl``: three or four ranged reads, whatever
the size of the weights.  ``zipfile.ZipFile`` is not used because it would read
more than that through a remote source.

Storage data offsets are *not* in the central directory: torch pads each local
header's extra field (64-byte alignment) but writes no extra field centrally,
so placing ``data/<key>`` needs one local-header read per storage.  A plain scan
therefore leaves ``data_start``/``data_end`` as None; ``locate_torch_zip_storages``
(or ``read_torch_zip(source, locate_data=True)``) pays those reads, for value scans.
"""

from __future__ import annotations

import io
import zlib

from guard.errors import MalformedCheckpoint
from guard.readers.torch_pickle import (
    MAX_PICKLE_BYTES,
    PickleWalker,
    StorageRef,
)
from guard.readers.torch_tensors import (
    CountingSource,
    storage_from_pid,
    torch_file_scan,
    unsafe_and_unreadable,
)
from guard.readers.zipdir import _LOCAL, ZipEntry, read_zip_directory
from guard.sources import ByteSource
from guard.tensors import FileScan

__all__ = ["ZipEntry", "locate_torch_zip_storages", "read_torch_zip", "read_zip_directory"]

MAX_INFLATED_PICKLE = 64 * 1024 * 1024  # torch never compresses; a deflated data.pkl is capped


def _archive_prefix(entries: dict[str, ZipEntry]) -> str:
    # torch names every record "<first entry's folder>/<record>"
    first = next(iter(entries), None)
    if first is None or "/" not in first:
        raise MalformedCheckpoint("zip has no top-level folder: not a torch checkpoint")
    return first.split("/", 1)[0]


def _read_entry_bytes(source: ByteSource, entry: ZipEntry) -> bytes:
    """Local header + data in one read (a second only if the header's extra field is long)."""
    if entry.flags & 0x1:
        raise MalformedCheckpoint(f"zip entry {entry.name!r} is encrypted")
    if entry.method not in (0, 8):
        raise MalformedCheckpoint(f"zip entry {entry.name!r} uses compression method {entry.method}")
    if entry.compressed_size > MAX_PICKLE_BYTES or (entry.method == 0 and entry.size > MAX_PICKLE_BYTES):
        raise MalformedCheckpoint(f"{entry.name!r} is {entry.size:,} bytes, over the pickle size limit")
    if entry.method == 0 and entry.size != entry.compressed_size:
        raise MalformedCheckpoint(f"stored zip entry {entry.name!r} has two different sizes")
    want = min(source.size - entry.header_offset,
               _LOCAL.size + len(entry.name.encode()) + 128 + entry.compressed_size)
    head = source.read_at(entry.header_offset, want)
    start = _local_data_offset(head, entry) - entry.header_offset
    end = start + entry.compressed_size
    if end > len(head):
        head += source.read_at(entry.header_offset + len(head), end - len(head))
    data = head[start:end]
    if entry.method == 0:
        return data
    inflater = zlib.decompressobj(-15)
    try:
        out = inflater.decompress(data, MAX_INFLATED_PICKLE)
    except zlib.error as exc:
        raise MalformedCheckpoint(f"cannot inflate {entry.name!r}: {exc}") from None
    if inflater.unconsumed_tail:
        raise MalformedCheckpoint(f"{entry.name!r} inflates past {MAX_INFLATED_PICKLE:,} bytes")
    return out


def _local_data_offset(head: bytes, entry: ZipEntry) -> int:
    """Absolute offset of an entry's data, from its local header (``head`` starts there)."""
    if len(head) < _LOCAL.size:
        raise MalformedCheckpoint(f"zip local header of {entry.name!r} is truncated")
    sig, *_rest, nlen, elen = _LOCAL.unpack_from(head)
    if sig != b"PK\x03\x04":
        raise MalformedCheckpoint(f"bad zip local header for {entry.name!r}")
    start = entry.header_offset + _LOCAL.size + nlen + elen
    return start


def locate_torch_zip_storages(source: ByteSource) -> dict[str, tuple[int, int]]:
    """Storage key -> absolute (start, end) of its bytes, for every stored ``data/<key>``.

    Costs one 30-byte local-header read per storage: meant for local value scans
    and conversion, not for remote header scans.
    """
    entries = read_zip_directory(source)
    return _locate(source, entries, _archive_prefix(entries))


def _locate(source: ByteSource, entries: dict[str, ZipEntry], prefix: str
            ) -> dict[str, tuple[int, int]]:
    folder = f"{prefix}/data/"
    spans: dict[str, tuple[int, int]] = {}
    for name, entry in entries.items():
        if not name.startswith(folder) or entry.method != 0:
            continue
        head = source.read_at(entry.header_offset, min(_LOCAL.size, source.size - entry.header_offset))
        start = _local_data_offset(head, entry)
        if start + entry.size > source.size:
            raise MalformedCheckpoint(f"{name!r} runs past the end of the file")
        spans[name[len(folder):]] = (start, start + entry.size)
    return spans


def read_torch_zip(source: ByteSource, *, locate_data: bool = False) -> FileScan:
    counted = CountingSource(source)
    entries = read_zip_directory(counted)
    prefix = _archive_prefix(entries)
    pickle_entry = entries.get(f"{prefix}/data.pkl")
    if pickle_entry is None:
        raise MalformedCheckpoint(f"zip has no {prefix}/data.pkl: not a torch checkpoint")
    walker = PickleWalker(storage_from_pid)
    try:
        root = walker.walk(io.BytesIO(_read_entry_bytes(counted, pickle_entry)))
        spans = _locate(counted, entries, prefix) if locate_data else {}

        def locate(storage: StorageRef) -> tuple[int, int] | None:
            entry = entries.get(f"{prefix}/data/{storage.key}")
            if entry is None:
                raise MalformedCheckpoint(f"data.pkl names storage {storage.key!r}, "
                                          f"which the zip does not hold")
            if entry.size < storage.view_offset + storage.nbytes:
                raise MalformedCheckpoint(f"storage {storage.key!r} is {entry.size} bytes, "
                                          f"shorter than its {storage.nbytes} bytes")
            return spans.get(storage.key)

        return torch_file_scan(source, "torch-zip", walker, root, locate, bytes_read=counted.bytes_read)
    except MalformedCheckpoint as exc:
        if not walker.unsafe:
            raise
        return unsafe_and_unreadable(source, "torch-zip", walker, exc, counted.bytes_read)
