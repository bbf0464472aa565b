"""TorchScript archives (``torch.jit.save``: ``.pt``, ``.pth``, ``.jit``, ``.ptl``).

A torch zip with a ``constants.pkl`` record is TorchScript (``torch.load`` hands it
to ``torch.jit.load`` by that test).  The weights are in two pickles:

- ``data.pkl``: the module object; parameters, buffers and tensor attributes are
  persistent ids into ``data/N``;
- ``constants.pkl``: a tuple of the tensors the code uses as constants, whose bytes
  are in ``constants/N``; in the lite format (``bytecode.pkl`` beside them) a key that is
  not there is looked up in ``data/`` (its shared storage context writes a storage once),
  and elsewhere a missing one is a missing record, as torch.jit.load finds it.  They are
  named ``constants.N``.

``code/`` (TorchScript source), ``bytecode.pkl`` (the lite interpreter's
instructions), ``extra/`` and ``traced_inputs.pkl`` (example inputs) hold no weights
and are not read.  The ``__torch__.*`` classes are compiled by the TorchScript
runtime from ``code/``; they are read as opaque records, never imported.  They are
no CG003 error, since no Python class is named, but ``torch.jit.load`` does compile
and run that code (``__setstate__`` at load time): one CG003 note per file says so.
A global outside torch's allowlist and ``__torch__`` stays a CG003 error.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import chain

from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding, Severity, shown
from guard.readers.binary.zipdir import ZipArchive
from guard.readers.torch.archive import locate_storages, storage_locator, walk_record
from guard.readers.torch.pickle import PickleWalker, StorageRef
from guard.readers.torch.records import check_directory, check_small_records
from guard.readers.torch.tensors import (
    build_tensor_infos,
    iter_named_tensors,
    no_tensor_findings,
    pickle_metadata,
    storage_from_pid,
    unsafe_and_unreadable,
    unsafe_findings,
)
from guard.sources import ByteSource, BytesSource, CountingSource, LocalFile
from guard.tensors import FileScan

CONSTANTS_FOLDER = "constants/"


def read_torchscript(source: ByteSource, counted: CountingSource, archive: ZipArchive, prefix: str, *,
                     locate_data: bool = False) -> FileScan:
    entries = archive.entries
    in_constants = False
    # only the lite format shares storages between data/ and constants/; torch.jit.load of any other
    # archive finds a constant in constants/ or refuses the file
    shared = f"{prefix}/bytecode.pkl" in entries

    def persistent_load(pid: object) -> object:
        ref = storage_from_pid(pid)
        if in_constants and isinstance(ref, StorageRef) and (
                not shared or f"{prefix}/{CONSTANTS_FOLDER}{ref.key}" in entries):
            ref = replace(ref, key=CONSTANTS_FOLDER + ref.key)  # its own key space
        return ref

    def record_of(key: str) -> str:
        return f"{prefix}/{key}" if key.startswith(CONSTANTS_FOLDER) else f"{prefix}/data/{key}"

    walker = PickleWalker(persistent_load, torchscript=True)
    try:
        root = walk_record(counted, entries[f"{prefix}/data.pkl"], walker)
        in_constants = True
        constants = walk_record(counted, entries[f"{prefix}/constants.pkl"], walker)
        check_directory(archive, prefix, source.size)
        check_small_records(counted, entries, prefix)
        cheap = locate_data or isinstance(source, (LocalFile, BytesSource))
        spans = locate_storages(counted, entries, prefix, ("data/", CONSTANTS_FOLDER)) if cheap else {}
        locate = storage_locator(counted, entries, record_of, cheap=cheap, spans=spans if locate_data else None)
        budget = max(100_000, 4 * walker.opcodes)
        named = chain(iter_named_tensors(root, budget=budget),
                      ((f"constants.{name}", ref) for name, ref in iter_named_tensors(constants, budget=budget)))
        tensors, dtype_findings = build_tensor_infos(named, file=source.name, locate=locate)
        storages = sum(name.startswith((f"{prefix}/data/", f"{prefix}/{CONSTANTS_FOLDER}")) for name in entries)
        findings = (*unsafe_findings(walker, source.name), *opaque_note(walker, source.name), *dtype_findings,
                    *no_tensor_findings(walker, source.name, storages=storages, tensors=len(tensors)))
        return FileScan(path=source.name, format="torchscript", size=source.size, tensors=tensors,
                        findings=findings, metadata=pickle_metadata(walker),
                        bytes_read=counted.bytes_read)
    except MalformedCheckpoint as exc:
        if not walker.unsafe:
            raise
        return unsafe_and_unreadable(source, "torchscript", walker, exc, counted.bytes_read)


def opaque_note(walker: PickleWalker, path: str) -> tuple[Finding, ...]:
    if not walker.opaque:
        return ()
    first = next(iter(walker.opaque))
    message = (f"TorchScript archive: {len(walker.opaque)} class(es) compiled from its code/ (e.g. {shown(first)}) "
               "were read as opaque records; nothing was imported or run. torch.jit.load compiles that "
               "TorchScript and runs its __setstate__ methods as it loads: load it only from a source you trust")
    return (make_finding("CG003", path, message)._replace(severity=Severity.note),)
