"""The records of a torch zip around data.pkl, checked as ``torch.load`` checks them.

torch's reader (miniz inside ``PyTorchStreamReader``) refuses an archive whose
central directory has an entry with masked headers, a stored entry with two sizes,
or an entry whose local header plus data would pass the end of the file; then, for
every record it reads, a bad local header signature, an unsupported method or
encryption, or data past the end of the file.  It reads ``version`` (or
``.data/version``: an integer from 1 to 10), ``byteorder`` (``little`` or ``big``),
``.storage_alignment`` (an integer), ``.format_version`` and
``.data/serialization_id``, and every storage ``data.pkl`` names.  All of that is
checked here from the directory and a few small reads: the small records sit next
to data.pkl or to the directory, in blocks a scan reads anyway.  Unlike torch,
which does not verify CRCs when it reads, the CRC of data.pkl is checked: a bit
flipped in a name or a shape there still loads in torch, as a different model.
"""

from __future__ import annotations

import zlib

from guard.errors import MalformedCheckpoint
from guard.readers.binary.zipdir import _LOCAL, ZipArchive, ZipEntry, check_supported, open_member, read_member
from guard.sources import ByteSource

MIN_VERSION, MAX_VERSION = 1, 10  # caffe2/serialize/versions.h: kMin/kMaxSupportedFileFormatVersion
MAX_SMALL_RECORD = 4096  # version, byteorder and the like are a few bytes
_MASKED_HEADERS = 0x2000


def check_directory(archive: ZipArchive, prefix: str, size: int) -> None:
    """The checks miniz and torch make on the directory and every entry when the archive is opened."""
    if archive.declared != archive.declared_on_disk or archive.declared > 0xFFFFFFFF:
        raise MalformedCheckpoint(f"zip end record declares {archive.declared:,} entries, "
                                  f"{archive.declared_on_disk:,} on this disk")
    folder = prefix + "/"
    for entry in archive.entries.values():
        try:  # torch.load lists every record's name as text (a C string: cut at its first NUL)
            entry.raw_name.split(b"\0", 1)[0].decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedCheckpoint(f"zip entry name {entry.raw_name[:100]!r} is not UTF-8") from None
        if not entry.name.startswith(folder):
            raise MalformedCheckpoint(f"zip entry {entry.name[:100]!r} is not in the archive's folder {folder!r}")
        if entry.flags & _MASKED_HEADERS:
            raise MalformedCheckpoint(f"zip entry {entry.name[:100]!r} has encrypted (masked) headers")
        if (entry.method == 0 and entry.size != entry.compressed_size) or (entry.size and not entry.compressed_size):
            raise MalformedCheckpoint(f"zip entry {entry.name[:100]!r} has inconsistent sizes")
        if entry.header_offset + _LOCAL.size + entry.compressed_size > size:
            raise MalformedCheckpoint(f"zip entry {entry.name[:100]!r} runs past the end of the file")


def check_readable(source: ByteSource, entry: ZipEntry, head: bytes | None = None) -> int:
    """What torch checks before it reads a record: flags, method, local header; returns the data offset.

    torch checks flags and method for every record (miniz's file stat), but miniz hands back a
    record of no compressed bytes (an empty tensor's storage) before it reads the local header:
    a damaged one there costs torch nothing, and is not held against the file.  Where that
    header does not read, the data offset is the header's own, as good as any for zero bytes.
    """
    if entry.compressed_size:
        return open_member(source, entry, head=head)
    check_supported(entry)
    try:
        return open_member(source, entry, head=head)
    except MalformedCheckpoint:
        return entry.header_offset


def check_crc(entry: ZipEntry, data: bytes) -> None:
    if zlib.crc32(data) != entry.crc:
        raise MalformedCheckpoint(f"{entry.name!r} does not match its CRC-32: the file is corrupted")


def read_record(source: ByteSource, entry: ZipEntry, *, limit: int) -> bytes:
    """A record's bytes (zipdir's one member reader, with miniz's checks; none for an empty one)."""
    if not entry.compressed_size:  # as check_readable: flags and method, no local header
        check_supported(entry)
        return b""
    return read_member(source, entry, limit=limit)


def refuse_case_twins(entries: dict[str, ZipEntry], names: tuple[str, ...]) -> None:
    """Refuse an archive that holds one of ``names`` only under another case.

    miniz finds a record by its name ignoring case, so torch would read ``archive/Data.pkl``
    for ``archive/data.pkl`` (or take ``archive/Constants.pkl`` for TorchScript).  The pickles
    and storages are matched by their exact names here, so such a file is refused by name.
    """
    missing = {name.lower(): name for name in names if name not in entries}
    if not missing:
        return
    for other in entries:
        name = missing.get(other.lower())
        if name is not None:
            raise MalformedCheckpoint(f"zip has no {name} but {other!r}: record names that differ only in case "
                                      "are read alike by torch and refused here")


def find_records(entries: dict[str, ZipEntry], names: tuple[str, ...]) -> dict[str, ZipEntry | None]:
    """Each of ``names`` as miniz finds it: the entry whose name matches ignoring case.

    A flipped case bit in the directory (``archive/Version``) still loads in torch with the
    right record, so it reads here too.  Two entries that match one name are refused: miniz
    would take either.  One pass over the entries for all ``names``.
    """
    found: dict[str, ZipEntry | None] = {name: None for name in names}
    folded = {name.lower(): name for name in names}
    for other, entry in entries.items():
        name = folded.get(other.lower())
        if name is None:
            continue
        first = found[name]
        if first is not None:
            raise MalformedCheckpoint(f"zip holds {first.name!r} and {other!r}: record names that differ "
                                      "only in case are read alike by torch and refused here")
        found[name] = entry
    return found


def check_small_records(source: ByteSource, entries: dict[str, ZipEntry], prefix: str) -> None:
    """version, byteorder, .storage_alignment, .format_version, .data/serialization_id."""
    names = (".data/version", "version", "byteorder", ".storage_alignment", ".format_version",
             ".data/serialization_id")
    records = find_records(entries, tuple(f"{prefix}/{name}" for name in names))
    get = {name: records[f"{prefix}/{name}"] for name in names}
    version = get[".data/version"] or get["version"]
    if version is None:
        raise MalformedCheckpoint("zip has no version record: not a torch checkpoint")
    _check_version(read_record(source, version, limit=MAX_SMALL_RECORD))
    if get["byteorder"] is not None:
        order = read_record(source, get["byteorder"], limit=MAX_SMALL_RECORD)
        if order not in (b"little", b"big"):
            raise MalformedCheckpoint(f"byteorder record is {order[:20]!r}, not 'little' or 'big'")
    if get[".storage_alignment"] is not None:
        text = read_record(source, get[".storage_alignment"], limit=MAX_SMALL_RECORD)
        try:
            int(text)
        except ValueError:
            raise MalformedCheckpoint(f".storage_alignment record is {text[:20]!r}, not a number") from None
    if get[".format_version"] is not None:
        read_record(source, get[".format_version"], limit=MAX_SMALL_RECORD)
    if get[".data/serialization_id"] is not None:  # torch.load decodes it as text
        try:
            read_record(source, get[".data/serialization_id"], limit=MAX_SMALL_RECORD).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedCheckpoint(".data/serialization_id record is not UTF-8 text") from None


def _check_version(text: bytes) -> None:
    """std::stoull's reading: leading blanks, then digits; the rest is ignored."""
    digits = text.lstrip(b" \t\n\v\f\r")
    negative = digits.startswith(b"-")
    digits = digits.lstrip(b"+-") if digits[:1] in (b"+", b"-") else digits
    count = len(digits) - len(digits.lstrip(b"0123456789"))
    if not count:
        raise MalformedCheckpoint(f"version record {text[:20]!r} is not a number")
    value = int(digits[:count])
    if negative and value:  # stoull wraps a negative number to a huge one
        value = 2**64 - value
    if not MIN_VERSION <= value <= MAX_VERSION:
        raise MalformedCheckpoint(f"torch zip format version {value} is not one torch reads "
                                  f"({MIN_VERSION} to {MAX_VERSION})")
