"""Where a model's tensors' bytes are: the inventory's, with a torch zip scanned headers-only placed again."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from guard.inventory import ModelInventory
from guard.tensors import TensorInfo


def located_tensors(inv: ModelInventory) -> Iterator[TensorInfo]:
    """The inventory's tensors; a torch zip scanned headers-only is re-read to place its storages."""
    for scan in inv.files:
        tensors = scan.tensors
        if scan.format in ("torch-zip", "torchscript") and any(t.data_start is None for t in tensors):
            tensors = _relocate_torch_zip(scan.path) or tensors
        yield from tensors


def _relocate_torch_zip(path: str) -> Sequence[TensorInfo] | None:
    from guard.readers import READ_FAILURES
    from guard.readers.torch.zip import read_torch_zip
    from guard.sources import LocalFile

    try:
        with LocalFile(path, name=path) as source:
            return read_torch_zip(source, locate_data=True).tensors
    except (OSError,) + READ_FAILURES:
        return None  # the tensors are then reported as not located
