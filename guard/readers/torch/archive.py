"""What the torch zip and TorchScript readers share: pickle records walked, storages checked and placed."""

from __future__ import annotations

import io
from collections.abc import Callable

from guard.errors import MalformedCheckpoint
from guard.readers.binary.zipdir import ZipEntry
from guard.readers.torch.pickle import MAX_PICKLE_BYTES, PickleWalker, StorageRef
from guard.readers.torch.records import check_crc, check_readable, read_record
from guard.readers.torch.tensors import Locate
from guard.sources import ByteSource


def locate_storages(source: ByteSource, entries: dict[str, ZipEntry], prefix: str,
                    folders: tuple[str, ...] = ("data/",)) -> dict[str, tuple[int, int]]:
    """Storage key -> absolute (start, end) of each stored record in ``folders`` (one local-header
    read each); keys of the first folder are bare, the others' keep their folder (``constants/0``)."""
    spans: dict[str, tuple[int, int]] = {}
    for index, folder in enumerate(folders):
        inside = f"{prefix}/{folder}"
        for name, entry in entries.items():
            if not name.startswith(inside) or entry.method != 0:
                continue
            start = check_readable(source, entry)
            spans[name[len(inside):] if index == 0 else name[len(prefix) + 1:]] = (start, start + entry.size)
    return spans


def walk_record(source: ByteSource, entry: ZipEntry, walker: PickleWalker) -> object:
    """A pickle record, walked; the walk comes first so an unsafe pickle is CG003 whatever else is wrong."""
    pickle_bytes = read_record(source, entry, limit=MAX_PICKLE_BYTES)
    try:
        root = walker.walk(io.BytesIO(pickle_bytes))
    except MalformedCheckpoint:
        check_crc(entry, pickle_bytes)  # a pickle that fails its CRC is reported as corrupted
        raise
    check_crc(entry, pickle_bytes)
    return root


def storage_locator(source: ByteSource, entries: dict[str, ZipEntry], record_of: Callable[[str], str], *,
                    cheap: bool, spans: dict[str, tuple[int, int]] | None) -> Locate:
    """Checks each storage a tensor names against its record; its span where ``spans`` are asked for."""
    def locate(storage: StorageRef) -> tuple[int, int] | None:
        entry = entries.get(record_of(storage.key))
        if entry is None:
            raise MalformedCheckpoint(f"the pickle names storage {storage.key!r}, which the zip does not hold")
        if entry.size < storage.view_offset + storage.nbytes:
            raise MalformedCheckpoint(f"storage {storage.key!r} is {entry.size} bytes, "
                                      f"shorter than its {storage.nbytes} bytes")
        if cheap and entry.method != 0:
            check_readable(source, entry)
        return spans.get(storage.key) if spans is not None else None

    return locate
