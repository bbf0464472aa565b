"""One DeepSpeed checkpoint file, read as torch.load would see it, without unpickling anything.

DeepSpeed's files are torch zips whose ``data.pkl`` references a few of DeepSpeed's own classes in every
checkpoint: the loss scaler, the ZeRO stage enum and the fragment addresses of ``param_slice_mappings``.
They hold plain numbers; the deepspeed row's list (``guard.training.registry.DEEPSPEED_STATES``) makes each an
``InertRecord`` (``guard.training.pickles``: the class's name, its call's arguments, BUILD's state).
Nothing is imported or called, and any other global stays CG003.
"""

from __future__ import annotations

import re

from guard.errors import MalformedCheckpoint
from guard.readers.binary.zipdir import read_zip_archive
from guard.readers.torch.archive import locate_storages, storage_locator, walk_record
from guard.readers.torch.pickle import TensorRef
from guard.readers.torch.records import check_directory, check_small_records
from guard.readers.torch.tensors import CountingSource, Locate, build_tensor_infos
from guard.records import Record
from guard.sources import ByteSource
from guard.tensors import TensorInfo
from guard.training.pickles import AllowListWalker
from guard.training.registry import DEEPSPEED_STATES

# DeepSpeed 0.19's checkpoint names: ``mp_rank_{tp:02d}_model_states.pt`` (stages 0-2),
# ``zero_pp_rank_{dp}_mp_rank_{tp:02d}_model_states.pt`` (stage 3) and
# ``{bf16_}zero_pp_rank_{dp}_mp_rank_{tp:02d}_optim_states.pt`` (``bf16_`` whenever bf16 is on: a
# run's setting, not the file's dtype).
FILE_NAME = re.compile(r"(?P<bf16>bf16_)?(?:zero_pp_rank_(?P<dp>\d{1,6})_)?mp_rank_(?P<mp>\d{2,6})_"
                       r"(?P<kind>model|optim)_states\.pt")


class ZeroName(Record):
    kind: str  # "model" | "optim"
    dp: int | None  # the data-parallel rank (None: the one model-states file of stages 0-2)
    mp: int
    bf16: bool


def parse_name(name: str) -> ZeroName | None:
    found = FILE_NAME.fullmatch(name)
    if (found is None or (found["kind"] == "optim" and found["dp"] is None)
            or (found["bf16"] and found["kind"] != "optim")):
        return None
    return ZeroName(found["kind"], int(found["dp"]) if found["dp"] is not None else None, int(found["mp"]),
                    bool(found["bf16"]))


class ZeroFile(Record):
    """A walked file: its pickle's description, how to place a tensor's bytes, the globals refused."""

    path: str
    size: int
    root: object
    locate: Locate | None
    unsafe: tuple[str, ...]
    bytes_read: int

    def tensor(self, name: str, ref: TensorRef) -> TensorInfo:
        """A tensor of the pickle as a TensorInfo with its byte range in this file."""
        assert self.locate is not None
        infos, _ = build_tensor_infos(iter([(name, ref)]), file=self.path, locate=self.locate)
        return infos[0]


def read_zero_file(source: ByteSource, *, locate: bool = True) -> ZeroFile:
    """The torch zip checks torch.load makes, then the walked pickle; a refused global stops the reading
    there (``unsafe``), as nothing a hostile pickle describes is trusted.  ``locate``: place each storage's
    bytes (one local-header read each: cheap on a disk, a request each on the Hub, where a scan needs
    only the sizes)."""
    counted = CountingSource(source)
    archive = read_zip_archive(counted)
    entries = archive.entries
    first = next(iter(entries), "")
    if "/" not in first:
        raise MalformedCheckpoint("zip has no top-level folder: not a torch checkpoint")
    prefix = first.split("/", 1)[0]
    pickle_entry = entries.get(f"{prefix}/data.pkl")
    if pickle_entry is None:
        raise MalformedCheckpoint(f"zip has no {prefix}/data.pkl: not a torch checkpoint")
    walker = AllowListWalker(DEEPSPEED_STATES)
    root = walk_record(counted, pickle_entry, walker)
    if walker.unsafe:
        return ZeroFile(source.name, source.size, None, None, tuple(walker.unsafe), counted.bytes_read)
    check_directory(archive, prefix, source.size)
    check_small_records(counted, entries, prefix)
    spans = locate_storages(counted, entries, prefix) if locate else None
    placer = storage_locator(counted, entries, lambda key: f"{prefix}/data/{key}", cheap=locate, spans=spans)
    return ZeroFile(source.name, source.size, root, placer, (), counted.bytes_read)
