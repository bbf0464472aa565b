"""A DCP ``.metadata`` pickle, read by an allow-list that builds inert records and never imports or calls.

torch writes ``.metadata`` with ``pickle.dump`` and reads it with plain ``pickle.load``
(pytorch/pytorch#189308): an untrusted checkpoint can run code there.  Here the trainers' allow-list walker
(``guard.training.pickles``) moves descriptions, with the dcp row's list (``guard.training.registry.DCP_METADATA``):
the ``torch.distributed.checkpoint`` metadata classes, ``torch.Size``, the torch dtypes, the layout and
memory-format helpers, ``pathlib``'s paths, the older ``TensorProperties`` and the planner records
Megatron keeps (``all_local_plans``).  Each becomes an ``InertRecord`` holding what the pickle gave it;
every other global is recorded by name (CG003) and nothing it would build is used.
"""

from __future__ import annotations

import io
import pickle

from guard.errors import MalformedCheckpoint
from guard.readers.torch.pickle import MAX_PICKLE_BYTES
from guard.training.pickles import AllowListWalker
from guard.training.registry import DCP_METADATA

MEM_FORMAT_CLASSES = frozenset({"_MEM_FORMAT_ENCODING", "MEM_FORMAT_ENCODING"})


def _no_persistent_ids(pid: object) -> object:
    raise MalformedCheckpoint("a DCP .metadata pickle holds no persistent ids; this one does")


def walk_metadata(data: bytes) -> tuple[object, tuple[str, ...]]:
    """The pickle's description and the globals it names outside the allow-list (in order)."""
    if len(data) > MAX_PICKLE_BYTES:
        raise MalformedCheckpoint(f".metadata is {len(data):,} bytes, past the {MAX_PICKLE_BYTES:,} read")
    if data[:1] == b"\x80" and len(data) > 1 and data[1] > pickle.HIGHEST_PROTOCOL:
        raise MalformedCheckpoint(f".metadata declares pickle protocol {data[1]}; pickle.load reads up to "
                                  f"{pickle.HIGHEST_PROTOCOL}")
    walker = AllowListWalker(DCP_METADATA, persistent_load=_no_persistent_ids)
    stream = io.BytesIO(data)
    root = walker.walk(stream)
    return root, tuple(walker.unsafe)
