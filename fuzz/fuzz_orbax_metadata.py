"""atheris target: Orbax metadata parsing (_METADATA leaves, path checks, zarr 2/3 metadata).

An input is ``_METADATA`` bytes, optionally followed by NUL and the bytes every
leaf's ``.zarray`` (or ``zarr.json``) holds: a checkpoint with OCDBT off, in memory.
"""

from __future__ import annotations

import sys

import atheris
from harness import READ_FAILURES

with atheris.instrument_imports(include=["guard"]):
    from guard.readers.orbax import read_orbax_checkpoint
    from guard.sources import BytesSource


def one_input(data: bytes) -> None:
    metadata, _, array = data.partition(b"\0")
    names = {"_METADATA": metadata}

    class Listing(dict):  # every array's metadata file exists, with the same bytes
        def __contains__(self, key: object) -> bool:
            return key == "_METADATA" or (isinstance(key, str) and key.endswith(("/.zarray", "/zarr.json")))

        def __getitem__(self, key: str) -> int:
            return len(names.get(key, array))

    def open_file(name: str) -> BytesSource:
        return BytesSource(names.get(name, array), name=name)

    files = Listing(_METADATA=len(metadata))
    try:
        scan = read_orbax_checkpoint("ckpt", files, open_file)
    except READ_FAILURES:
        raise AssertionError("read_orbax_checkpoint raised instead of returning CG001") from None
    assert scan.format == "orbax" or scan.findings


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
