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
import struct
import zlib
from dataclasses import dataclass

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
from guard.sources import ByteSource
from guard.tensors import FileScan

_EOCD = struct.Struct("<4sHHHHIIH")  # End Of Central Directory, 22 bytes + comment
_ZIP64_LOCATOR = struct.Struct("<4sIQI")  # 20 bytes, just before the EOCD
_ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")  # 56 bytes
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # 46 bytes + name + extra + comment
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # 30 bytes + name + extra
_FIRST_TAIL = 1024  # torch writes no zip comment: the EOCD is the last 22 bytes
_MAX_TAIL = 65535 + _EOCD.size
MAX_DIRECTORY = 64 * 1024 * 1024  # ~70 bytes per entry: about a million storages
MAX_INFLATED_PICKLE = 64 * 1024 * 1024  # torch never compresses; a deflated data.pkl is capped


@dataclass(frozen=True, slots=True)
class ZipEntry:
    name: str
    method: int
    flags: int
    compressed_size: int
    size: int
    header_offset: int


def read_zip_directory(source: ByteSource) -> dict[str, ZipEntry]:
    """The central directory, entries in archive order; duplicate names are refused."""
    cd_offset, cd_size, count, cd_limit = _find_directory(source)
    if cd_size > MAX_DIRECTORY:
        raise MalformedCheckpoint(f"zip central directory of {cd_size:,} bytes exceeds the limit")
    if cd_offset + cd_size > cd_limit or count > cd_size // _CENTRAL.size:
        raise MalformedCheckpoint("zip central directory does not fit where the EOCD places it")
    directory = source.read_at(cd_offset, cd_size)
    entries: dict[str, ZipEntry] = {}
    pos = 0
    for _ in range(count):
        if pos + _CENTRAL.size > cd_size:
            raise MalformedCheckpoint("zip central directory is truncated")
        (sig, _made, _need, flags, method, _t, _d, _crc, csize, usize, nlen, elen, clen,
         disk, _ia, _ea, offset) = _CENTRAL.unpack_from(directory, pos)
        if sig != b"PK\x01\x02":
            raise MalformedCheckpoint(f"bad zip central directory entry at byte {cd_offset + pos}")
        start = pos + _CENTRAL.size
        pos = start + nlen + elen + clen
        if pos > cd_size:
            raise MalformedCheckpoint("zip central directory entry runs past the directory")
        name = directory[start : start + nlen].decode("utf-8", "replace")
        extra = directory[start + nlen : start + nlen + elen]
        if disk:
            raise MalformedCheckpoint("multi-disk zip archives are not torch checkpoints")
        usize, csize, offset = _zip64_sizes(extra, usize, csize, offset)
        if name in entries:
            raise MalformedCheckpoint(f"zip holds {name!r} twice")
        if offset + _LOCAL.size > cd_offset:
            raise MalformedCheckpoint(f"zip entry {name!r} starts past the file data")
        entries[name] = ZipEntry(name, method, flags, csize, usize, offset)
    return entries


def _find_directory(source: ByteSource) -> tuple[int, int, int, int]:
    """(directory offset, size, entry count, offset it must end before)."""
    found = None
    for tail_size in (_FIRST_TAIL, _MAX_TAIL):
        tail_size = min(tail_size, source.size)
        tail = source.read_at(source.size - tail_size, tail_size)
        found = _last_eocd(tail)
        if found is not None or tail_size == source.size:
            break
    if found is None:
        raise MalformedCheckpoint("no zip End Of Central Directory record: truncated or not a zip")
    eocd_at = source.size - tail_size + found
    _sig, disk, cd_disk, _n_disk, count, cd_size, cd_offset, _clen = _EOCD.unpack_from(tail, found)
    if disk or cd_disk:
        raise MalformedCheckpoint("multi-disk zip archives are not torch checkpoints")
    if eocd_at >= _ZIP64_LOCATOR.size:
        loc = (tail[found - _ZIP64_LOCATOR.size : found] if found >= _ZIP64_LOCATOR.size
               else source.read_at(eocd_at - _ZIP64_LOCATOR.size, _ZIP64_LOCATOR.size))
        sig, _disk, z64_at, _disks = _ZIP64_LOCATOR.unpack(loc)
        if sig == b"PK\x06\x07":
            if z64_at + _ZIP64_EOCD.size > eocd_at - _ZIP64_LOCATOR.size:
                raise MalformedCheckpoint("zip64 locator points past the end of the archive")
            (sig, _size, _made, _need, disk, cd_disk, _n_disk, count, cd_size,
             cd_offset) = _ZIP64_EOCD.unpack(source.read_at(z64_at, _ZIP64_EOCD.size))
            if sig != b"PK\x06\x06" or disk or cd_disk:
                raise MalformedCheckpoint("bad zip64 End Of Central Directory record")
            return cd_offset, cd_size, count, z64_at
    if 0xFFFFFFFF in (cd_size, cd_offset) or count == 0xFFFF:
        raise MalformedCheckpoint("zip needs a zip64 record but has none")
    return cd_offset, cd_size, count, eocd_at


def _last_eocd(tail: bytes) -> int | None:
    end = len(tail)
    while (at := tail.rfind(b"PK\x05\x06", 0, end)) >= 0:
        if at + _EOCD.size <= len(tail):
            comment = _EOCD.unpack_from(tail, at)[-1]
            if at + _EOCD.size + comment == len(tail):
                return at
        end = at
    return None


def _zip64_sizes(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    """Replace 0xFFFFFFFF fields by the zip64 extra field's values, in the spec's order."""
    fields = [usize, csize, offset]
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 0x0001:
            body = extra[pos + 4 : pos + 4 + length]
            values = iter(struct.unpack_from(f"<{len(body) // 8}Q", body))
            for i, value in enumerate(fields):
                if value == 0xFFFFFFFF:
                    wide = next(values, None)
                    if wide is None:
                        raise MalformedCheckpoint("zip64 extra field is too short")
                    fields[i] = wide
            break
        pos += 4 + length
    return fields[0], fields[1], fields[2]


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
