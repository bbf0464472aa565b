"""TensorFlow layouts by name: tensor bundles and SavedModel folders, for the local and the Hub scan alike.

* A tensor bundle is ``<prefix>.index`` (the weight file: dtypes and shapes)
  with ``<prefix>.data-0000k-of-0000n`` shards (its companions, never weight
  files of their own).  TF checkpoints (``ckpt-3.index``, ``model.ckpt-1000.index``)
  are bundles, each a set of its own.  Locally an ``.index`` is a bundle when it
  ends with the LevelDB table magic; on the Hub, when a data shard of its prefix is
  listed beside it (other ``.index`` files, FAISS indexes for one, are not weights).
* A SavedModel (``saved_model.pb`` + ``variables/`` + ``assets/`` + ``fingerprint.pb``)
  is one set: ``variables/variables.index`` is scanned in the SavedModel's own
  model, the ``variables/`` folder is not a model of its own, and the folder's
  ``.pb`` files (the graph, its fingerprint, Keras' metadata) belong to the set
  instead of being CG006.  The graph itself is not read: variables hold a
  SavedModel's weights (a frozen TF1 graph keeps them as Const nodes: that is a
  bare ``.pb``, still CG006).

``rebase_companions`` makes a scan's companions (named beside their file) relative
to the model directory, where the inventory resolves them.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Sequence

from guard.records import Record
from guard.tensors import FileScan

SAVED_MODEL_GRAPHS = frozenset({"saved_model.pb", "saved_model.pbtxt"})
SAVED_MODEL_FILES = SAVED_MODEL_GRAPHS | {"fingerprint.pb", "keras_metadata.pb"}
VARIABLES_DIR = "variables"
VARIABLES_INDEX = "variables.index"
_DATA_SHARD = r"^(.+)\.data-\d{5}-of-\d{5}$"  # compiled on first use (re caches it): not on the hook's path
_TABLE_MAGIC = bytes.fromhex("57fb808b247547db")


def data_shard_prefix(name: str) -> str | None:
    """``ckpt-1`` for ``ckpt-1.data-00000-of-00001``; None for any other name."""
    match = re.match(_DATA_SHARD, name) if ".data-" in name else None
    return match.group(1) if match else None


# ---------------------------------------------------------------- local


# Local paths are clean strings (``guard.inventory.discovery.clean_path``): no pathlib on the hook's path.
def is_saved_model_root(directory: str) -> bool:
    return any(os.path.isfile(os.path.join(directory, g)) for g in SAVED_MODEL_GRAPHS) and os.path.isfile(
        os.path.join(directory, VARIABLES_DIR, VARIABLES_INDEX))


def model_dir(directory: str) -> str:
    """A SavedModel's ``variables/`` folder stands for the SavedModel; any other folder for itself."""
    head, sep, name = directory.rpartition("/")
    if name == VARIABLES_DIR:
        parent = (head or "/") if sep else "."
        if is_saved_model_root(parent):
            return parent
    return directory


def local_weights(directory: str, entries: Sequence[os.DirEntry[str]], weights: list[str]) -> list[str]:
    """The weight files of a folder with TensorFlow's files sorted out (see the module docstring)."""
    if not any(e.name.endswith((".index", ".pb", ".pbtxt")) or ".data-" in e.name for e in entries):
        return weights  # the common case, decided by names alone (the pre-commit hook's path)
    names = {e.name for e in entries if e.is_file()}
    inside_saved_model = model_dir(directory) != directory
    saved_model = is_saved_model_root(directory)
    kept = []
    for weight in weights:
        name = os.path.basename(weight)
        prefix = data_shard_prefix(name)
        if not (prefix and f"{prefix}.index" in names) and not (saved_model and name in SAVED_MODEL_FILES) \
                and not name.endswith(".index"):
            kept.append(weight)
    if not inside_saved_model:
        kept += [os.path.join(directory, n) for n in sorted(names)
                 if n.endswith(".index") and _has_table_magic(os.path.join(directory, n))]
    if saved_model:
        kept.append(os.path.join(directory, VARIABLES_DIR, VARIABLES_INDEX))
    return kept


def _has_table_magic(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 48:
                return False
            fh.seek(size - 8)
            return fh.read(8) == _TABLE_MAGIC
    except OSError:
        return False


# ---------------------------------------------------------------- Hub listing


class TfListing(Record):
    indexes: dict[str, str]  # bundle index path -> the directory of the model it belongs to
    members: frozenset[str]  # data shards and SavedModel .pb files: part of a set, never scanned alone


def hub_listing(names: Iterable[str]) -> TfListing:
    listed = set(names)
    prefixes = {posixpath.join(posixpath.dirname(n), p) for n in listed
                if (p := data_shard_prefix(posixpath.basename(n))) is not None}
    indexes: dict[str, str] = {}
    members: set[str] = set()
    for name in listed:
        if name.endswith(".index") and name[: -len(".index")] in prefixes:
            folder = posixpath.dirname(name)
            indexes[name] = folder
            members.update(n for n in listed if n.startswith(name[: -len(".index")] + ".data-"))
            root = posixpath.dirname(folder)
            if (posixpath.basename(folder) == VARIABLES_DIR and posixpath.basename(name) == VARIABLES_INDEX
                    and any(posixpath.join(root, g) in listed for g in SAVED_MODEL_GRAPHS)):
                indexes[name] = root
                members.update(posixpath.join(root, f) for f in SAVED_MODEL_FILES)
    return TfListing(indexes, frozenset(members & listed))


# ---------------------------------------------------------------- both


def rebase_companions(scans: Iterable[FileScan], model_path: str) -> list[FileScan]:
    """Companions are named beside their file; a file in a subfolder (variables/) gets them rebased."""
    out = []
    for scan in scans:
        if not scan.companions:  # most files: nothing to rebase
            out.append(scan)
            continue
        folder = posixpath.dirname(scan.path)
        if scan.companions and folder and folder != model_path and folder.startswith(model_path.rstrip("/") + "/"):
            sub = folder[len(model_path.rstrip("/")) + 1 :]
            scan = scan._replace(companions=tuple(f"{sub}/{c}" for c in scan.companions))
        elif scan.companions and folder and model_path in ("", ".") and "/" not in folder:
            scan = scan._replace(companions=tuple(f"{folder}/{c}" for c in scan.companions))
        out.append(scan)
    return out
