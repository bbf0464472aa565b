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

from guard.errors import MalformedCheckpoint
from guard.readers.binary.zipdir import ZipEntry, read_zip_archive, read_zip_directory
from guard.readers.torch.archive import locate_storages, storage_locator, walk_record
from guard.readers.torch.export import is_export_archive, read_export_archive
from guard.readers.torch.pickle import PickleWalker
from guard.readers.torch.records import check_directory, check_small_records, refuse_case_twins
from guard.readers.torch.tensors import (
    CountingSource,
    storage_from_pid,
    torch_file_scan,
    unsafe_and_unreadable,
)
from guard.sources import ByteSource, BytesSource, LocalFile
from guard.tensors import FileScan

__all__ = ["ZipEntry", "locate_torch_zip_storages", "read_torch_zip", "read_zip_directory"]



def _archive_prefix(entries: dict[str, ZipEntry]) -> str:
    # torch names every record "<first entry's folder>/<record>"
    first = next(iter(entries), None)
    if first is None or "/" not in first:
        raise MalformedCheckpoint("zip has no top-level folder: not a torch checkpoint")
    return first.split("/", 1)[0]


def locate_torch_zip_storages(source: ByteSource) -> dict[str, tuple[int, int]]:
    """Storage key -> absolute (start, end) of its bytes, for every stored ``data/<key>``.

    Costs one 30-byte local-header read per storage: meant for local value scans
    and conversion, not for remote header scans.
    """
    entries = read_zip_directory(source)
    return locate_storages(source, entries, _archive_prefix(entries))


def read_torch_zip(source: ByteSource, *, locate_data: bool = False) -> FileScan:
    """The tensors data.pkl describes, after the checks torch.load makes on the archive.

    Local headers of the storages are checked (and placed) where reads are cheap:
    a local or in-memory file, or when ``locate_data`` asks for the byte ranges.
    A remote scan leaves them: one ranged request per storage.
    """
    counted = CountingSource(source)
    archive = read_zip_archive(counted)
    entries = archive.entries
    if is_export_archive(entries):  # torch.export.save: weights and constants configs, no data.pkl
        return read_export_archive(source, counted, archive)
    prefix = _archive_prefix(entries)
    pickle_entry = entries.get(f"{prefix}/data.pkl")
    if pickle_entry is None:
        refuse_case_twins(entries, (f"{prefix}/data.pkl",))
        raise MalformedCheckpoint(f"zip has no {prefix}/data.pkl: not a torch checkpoint")
    constants = f"{prefix}/constants.pkl"
    refuse_case_twins(entries, (constants,))  # torch would take the archive for TorchScript
    if constants in entries:  # torch.load hands such an archive to torch.jit.load
        from guard.readers.torch.torchscript import read_torchscript

        return read_torchscript(source, counted, archive, prefix, locate_data=locate_data)
    walker = PickleWalker(storage_from_pid)
    try:
        root = walk_record(counted, pickle_entry, walker)
        check_directory(archive, prefix, source.size)
        check_small_records(counted, entries, prefix)
        cheap = locate_data or isinstance(source, (LocalFile, BytesSource))
        spans = locate_storages(counted, entries, prefix) if cheap else {}
        locate = storage_locator(counted, entries, lambda key: f"{prefix}/data/{key}", cheap=cheap,
                                 spans=spans if locate_data else None)
        storages = sum(name.startswith(f"{prefix}/data/") for name in entries)
        return torch_file_scan(source, "torch-zip", walker, root, locate, bytes_read=counted.bytes_read,
                               storages=storages)
    except MalformedCheckpoint as exc:
        if not walker.unsafe:
            raise
        return unsafe_and_unreadable(source, "torch-zip", walker, exc, counted.bytes_read)
