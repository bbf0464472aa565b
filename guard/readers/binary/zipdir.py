"""The zip container, read through a ByteSource: the end record, the central directory, members.

Shared by the torch zip (and TorchScript), torch.export ``.pt2``, NumPy ``.npz``
and Keras ``.keras`` readers: this module is their one way to place a member's
data (``open_member``), read it whole under a size cap (``read_member``), read
the start of it (``MemberPrefix``) or see a stored one as a ByteSource of its own
(``MemberSource``).  ``zipfile.ZipFile`` is
not used: through a remote source it would read more than the few ranges a scan
needs.  Every entry is checked against the archive's layout (inside the file data,
no two entries sharing bytes: the overlapping-entry "zip bomb"), duplicate names
are refused, and zip64 records are followed.
"""

from __future__ import annotations

import struct
import zlib

from guard.errors import MalformedCheckpoint
from guard.records import Record
from guard.sources import ByteSource

_EOCD = struct.Struct("<4sHHHHIIH")  # End Of Central Directory, 22 bytes + comment
_ZIP64_LOCATOR = struct.Struct("<4sIQI")  # 20 bytes, just before the EOCD
_ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")  # 56 bytes
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # 46 bytes + name + extra + comment
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # 30 bytes + name + extra
_FIRST_TAIL = 1024  # torch writes no zip comment: the EOCD is the last 22 bytes
_MAX_TAIL = 65535 + _EOCD.size
MAX_DIRECTORY = 64 * 1024 * 1024  # ~70 bytes per entry: about a million storages


class ZipEntry(Record):
    name: str
    method: int
    flags: int
    compressed_size: int
    size: int
    header_offset: int
    crc: int = 0
    raw_name: bytes = b""
    version_needed: int = 20  # "version needed to extract", times ten (2.0)


class ZipArchive(Record):
    entries: dict[str, ZipEntry]
    directory_offset: int  # where the file data ends
    declared: int = 0  # entries the end record declares
    declared_on_disk: int = 0  # ... "on this disk" (the same number in a one-disk archive)
    gap: int = 0  # bytes between the directory's end and the end record that follows it


def read_zip_directory(source: ByteSource) -> dict[str, ZipEntry]:
    """The central directory, entries in archive order; duplicate names are refused."""
    return read_zip_archive(source).entries


def read_zip_archive(source: ByteSource, *, whole_directory: bool = False) -> ZipArchive:
    """The central directory, checked against the layout it describes (no local header is read).

    Entries must start at distinct offsets inside the file data, and each must have
    room for its local header, name and compressed bytes before the next one starts:
    entries that share bytes are refused.

    miniz (torch) reads as many entries as the end record counts.  Python's zipfile (numpy,
    Keras) never looks at that count: it reads entries until the directory's declared size
    is used up.  ``whole_directory`` reads as zipfile does, so that a count lowered by
    damage cannot hide members the loader still loads (and skips miniz's check of the
    zip64 end record's own size, which zipfile never reads).
    """
    cd_offset, cd_size, count, cd_limit, on_disk = _find_directory(source, zipfile_reads=whole_directory)
    if cd_size > MAX_DIRECTORY:
        raise MalformedCheckpoint(f"zip central directory of {cd_size:,} bytes exceeds the limit")
    if cd_offset + cd_size > cd_limit or (not whole_directory and count > cd_size // _CENTRAL.size):
        raise MalformedCheckpoint("zip central directory does not fit where the EOCD places it")
    directory = source.read_at(cd_offset, cd_size)
    entries: dict[str, ZipEntry] = {}
    pos = 0
    while (pos < cd_size) if whole_directory else (len(entries) < count):
        if pos + _CENTRAL.size > cd_size:
            raise MalformedCheckpoint("zip central directory is truncated")
        (sig, _made, need, flags, method, _t, _d, crc, csize, usize, nlen, elen, clen,
         disk, _ia, _ea, offset) = _CENTRAL.unpack_from(directory, pos)
        if sig != b"PK\x01\x02":
            raise MalformedCheckpoint(f"bad zip central directory entry at byte {cd_offset + pos}")
        start = pos + _CENTRAL.size
        pos = start + nlen + elen + clen
        if pos > cd_size:
            raise MalformedCheckpoint("zip central directory entry runs past the directory")
        raw_name = directory[start : start + nlen]
        name = raw_name.decode("utf-8", "replace")
        extra = directory[start + nlen : start + nlen + elen]
        if disk:
            raise MalformedCheckpoint("multi-disk zip archives are not torch checkpoints")
        usize, csize, offset = _zip64_sizes(extra, usize, csize, offset)
        if name in entries:
            raise MalformedCheckpoint(f"zip holds {name!r} twice")
        if offset + _LOCAL.size > cd_offset:
            raise MalformedCheckpoint(f"zip entry {name!r} starts past the file data")
        entries[name] = ZipEntry(name, method, flags, csize, usize, offset, crc, raw_name, need)
    _check_layout(entries, cd_offset)
    return ZipArchive(entries, cd_offset, count, on_disk, cd_limit - cd_offset - cd_size)


def read_zipfile_archive(source: ByteSource) -> ZipArchive:
    """The directory as Python's zipfile reads it, for the readers whose loader opens the file with
    zipfile (numpy.load, keras.saving.load_model): every entry the declared size holds, whatever the
    end record counts.  Bytes between the directory and the end record are refused: zipfile would
    take them for bytes prepended to the archive and read every member that many bytes further on."""
    archive = read_zip_archive(source, whole_directory=True)
    if archive.gap:
        raise MalformedCheckpoint(f"{archive.gap:,} stray bytes between the zip directory and its end record")
    return archive


def _check_layout(entries: dict[str, ZipEntry], cd_offset: int) -> None:
    ordered = sorted(entries.values(), key=lambda e: e.header_offset)
    for entry, after in zip(ordered, [*ordered[1:], None]):
        limit = cd_offset if after is None else after.header_offset
        least = entry.header_offset + _LOCAL.size + len(entry.raw_name) + entry.compressed_size
        if least > limit:
            other = "the central directory" if after is None else repr(after.name)
            raise MalformedCheckpoint(f"zip entry {entry.name!r} overlaps {other}")


def local_data_offset(source: ByteSource, entry: ZipEntry, head: bytes | None = None) -> int:
    """Absolute offset of an entry's data, from its local header (``head``: bytes read from there)."""
    if head is None:
        head = source.read_at(entry.header_offset, min(_LOCAL.size, source.size - entry.header_offset))
    if len(head) < _LOCAL.size:
        raise MalformedCheckpoint(f"zip local header of {entry.name!r} is truncated")
    sig, *_rest, nlen, elen = _LOCAL.unpack_from(head)
    if sig != b"PK\x03\x04":
        raise MalformedCheckpoint(f"bad zip local header for {entry.name!r}")
    return entry.header_offset + _LOCAL.size + nlen + elen


def _find_directory(source: ByteSource, *, zipfile_reads: bool = False) -> tuple[int, int, int, int, int]:
    """(directory offset, size, entry count, offset it must end before, entries "on this disk").

    ``zipfile_reads``: the loader is Python's zipfile, which skips a check miniz makes (below)."""
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
    _sig, disk, cd_disk, on_disk, count, cd_size, cd_offset, _clen = _EOCD.unpack_from(tail, found)
    if disk or cd_disk:
        raise MalformedCheckpoint("multi-disk zip archives are not torch checkpoints")
    if eocd_at >= _ZIP64_LOCATOR.size:
        loc = (tail[found - _ZIP64_LOCATOR.size : found] if found >= _ZIP64_LOCATOR.size
               else source.read_at(eocd_at - _ZIP64_LOCATOR.size, _ZIP64_LOCATOR.size))
        sig, _disk, z64_at, disks = _ZIP64_LOCATOR.unpack(loc)
        if sig == b"PK\x06\x07" and disks > 1:  # miniz and zipfile refuse it, whatever the records say
            raise MalformedCheckpoint(f"zip64 locator counts {disks:,} disks: multi-disk zip archives are not read")
        # miniz (torch) refuses a locator that points past the end; a zip64 record without its
        # signature is ignored, as miniz and zipfile ignore it: the 32-bit record then has to do.
        if sig == b"PK\x06\x07" and z64_at + _ZIP64_EOCD.size > source.size:
            raise MalformedCheckpoint("zip64 locator points past the end of the archive")
        # miniz reads the record where the locator points even where it runs into the locator
        # itself (a damaged tail), and then takes its counts: so does this reader.
        if sig == b"PK\x06\x07":
            (sig, size64, _made, _need, disk64, cd_disk64, on_disk64, count64, cd_size64,
             cd_offset64) = _ZIP64_EOCD.unpack(source.read_at(z64_at, _ZIP64_EOCD.size))
            # miniz refuses a record that declares itself shorter than its fields (the size counts
            # the bytes after the size field: 44); zipfile never reads that size
            if sig == b"PK\x06\x06" and not zipfile_reads and size64 < _ZIP64_EOCD.size - 12:
                raise MalformedCheckpoint(f"zip64 end record declares {size64:,} bytes, fewer than its own fields")
            if sig == b"PK\x06\x06":
                if disk64 or cd_disk64:
                    raise MalformedCheckpoint("multi-disk zip archives are not torch checkpoints")
                return cd_offset64, cd_size64, count64, z64_at, on_disk64
    if 0xFFFFFFFF in (cd_size, cd_offset) or count == 0xFFFF:
        raise MalformedCheckpoint("zip needs a zip64 record but has none")
    return cd_offset, cd_size, count, eocd_at, on_disk


def _last_eocd(tail: bytes) -> int | None:
    """The last complete end record.  Its comment length is not held against it: miniz (torch)
    and Python's zipfile both take the last signature, and so a truncated comment still reads."""
    at = tail.rfind(b"PK\x05\x06", 0, len(tail) - _EOCD.size + 4)
    return at if at >= 0 else None


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


# ------------------------------------------------------------------ members

REFUSED_FLAGS = 0x1 | 0x20 | 0x40  # encrypted, compressed patch data, strong encryption: miniz and zipfile refuse


def check_supported(entry: ZipEntry) -> None:
    """Flags and method, from the directory alone: what miniz's file stat and zipfile refuse."""
    if entry.flags & REFUSED_FLAGS:
        raise MalformedCheckpoint(f"zip entry {entry.name!r} is encrypted")
    if entry.method not in (0, 8):
        raise MalformedCheckpoint(f"zip entry {entry.name!r} uses compression method {entry.method}")


def open_member(source: ByteSource, entry: ZipEntry, *, end: int | None = None, head: bytes | None = None,
                zipfile_checks: bool = False) -> int:
    """Absolute offset of a member's data, after the checks every reader of a member makes.

    Flags, method, local header signature, and data that ends before ``end`` (the next
    entry or the directory for a reader that cares, else the end of the file).
    ``zipfile_checks`` adds what Python's zipfile (and so numpy and Keras) checks
    and miniz (torch) does not: the local header's name, and a stored member's two sizes.
    ``head``: bytes already read from the local header on.
    """
    check_supported(entry)
    end = source.size if end is None else end
    if zipfile_checks:
        if entry.method == 0 and entry.size != entry.compressed_size:
            raise MalformedCheckpoint(f"stored zip entry {entry.name!r} has two different sizes")
        want = _LOCAL.size + len(entry.raw_name)
        if head is None or len(head) < want:
            head = source.read_at(entry.header_offset, max(0, min(want, end - entry.header_offset)))
    start = local_data_offset(source, entry, head)
    if zipfile_checks and head is not None:  # head is set and at least a local header long here
        (nlen,) = struct.unpack_from("<H", head, 26)
        if head[_LOCAL.size : _LOCAL.size + nlen] != entry.raw_name:
            raise MalformedCheckpoint(f"zip entry {entry.name!r} has another name in its local header")
    if start + entry.compressed_size > end:
        what = "the end of the file" if end == source.size else "the next entry or the directory"
        raise MalformedCheckpoint(f"zip entry {entry.name!r} runs past {what}")
    return start


def read_member(source: ByteSource, entry: ZipEntry, *, limit: int, zipfile_checks: bool = False) -> bytes:
    """A member's bytes, inflated, at most ``limit`` of them: local header and data in one read
    (a second only for a long extra field).  A deflated member must inflate to exactly its
    declared size: a zip bomb that lies about its size stops one byte past it."""
    if max(entry.size, entry.compressed_size) > limit:
        raise MalformedCheckpoint(f"{entry.name!r} is {entry.size:,} bytes, over the {limit:,}-byte limit")
    want = min(source.size - entry.header_offset, _LOCAL.size + len(entry.raw_name) + 128 + entry.compressed_size)
    head = source.read_at(entry.header_offset, want)
    start = open_member(source, entry, head=head, zipfile_checks=zipfile_checks) - entry.header_offset
    end = start + entry.compressed_size
    if end > len(head):
        head += source.read_at(entry.header_offset + len(head), end - len(head))
    data = head[start:end]
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


class MemberPrefix:
    """The first bytes of a member, inflated as far as asked and no further.

    Input is read 1 KiB, then 4 KiB, ... (at most 1 MiB) at a time, and the state is kept, so a reader
    that learns from the first bytes how many more it needs (an ``.npy`` header) reads on.
    """

    def __init__(self, source: ByteSource, entry: ZipEntry, start: int) -> None:
        self.source, self.entry, self.start = source, entry, start
        self._inflater = zlib.decompressobj(-15) if entry.method == 8 else None
        self._out, self._pos, self._chunk = b"", 0, 1024

    def read(self, n: int) -> bytes:
        """The first ``n`` bytes of the member's content (fewer where it ends first)."""
        size = self.entry.compressed_size
        if self._inflater is None:
            return self.source.read_at(self.start, min(n, size))
        inflater = self._inflater
        while len(self._out) < n and not inflater.eof and (self._pos < size or inflater.unconsumed_tail):
            data = b""
            if self._pos < size:
                data = self.source.read_at(self.start + self._pos, min(self._chunk, size - self._pos))
                self._pos, self._chunk = self._pos + len(data), min(self._chunk * 4, 1024 * 1024)
            try:
                self._out += inflater.decompress(inflater.unconsumed_tail + data, n - len(self._out))
            except zlib.error as exc:
                raise MalformedCheckpoint(f"cannot inflate {self.entry.name!r}: {exc}") from None
        return self._out[:n]


class MemberSource:
    """A stored member as a ByteSource of its own (reads go to the archive)."""

    def __init__(self, parent: ByteSource, start: int, size: int, name: str) -> None:
        self.parent, self.start, self.size, self.name = parent, start, size, name

    def read_at(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise MalformedCheckpoint(
                f"read of {size} bytes at offset {offset} runs past the end of {self.name} ({self.size} bytes)")
        return self.parent.read_at(self.start + offset, size)
