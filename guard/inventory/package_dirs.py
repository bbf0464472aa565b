"""Weight sets made of several files: OpenVINO IR pairs and Core ML packages, by name alone.

* An OpenVINO IR is ``X.xml`` (the graph, with every constant's type, shape and
  place) and ``X.bin`` (their bytes, nothing else).  The ``.xml`` is the set's
  file; the ``.bin`` is its companion and is never read as a weight file of its
  own: a PyTorch reader would call it CG001.  Only a ``.bin`` whose name is a
  convention of another library (``pytorch_model.bin``, ``training_args.bin``)
  is still read as what that library would load.
* A Core ML ``X.mlpackage`` folder is one set; nothing inside it is a model
  directory or a weight file of its own (``weights/weight.bin`` is MIL blob storage).

``discovery`` (local) and ``guard.hub`` (the Hub listing) call these with the
names they see, so both scans find the same sets.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from guard.inventory.names import convention_of
from guard.readers import READ_FAILURES, unreadable
from guard.sources import BytesSource, LocalFile
from guard.tensors import FileScan

PACKAGE_SUFFIX = ".mlpackage"


def ir_members(names: Iterable[str]) -> tuple[set[str], set[str]]:
    """(``.xml`` files that are IRs, ``.bin`` files that are their data) among the names of one listing.

    An ``.xml`` is an IR when a ``.bin`` of its stem is beside it, or when its name is optimum-intel's
    (``openvino_model.xml``: a missing ``.bin`` is then CG004, not silence).
    """
    listed = set(names)
    irs: set[str] = set()
    data: set[str] = set()
    for name in listed:
        if not name.lower().endswith(".xml"):
            continue
        companion = name[:-4] + ".bin"
        paired = companion in listed
        if paired or _is_openvino_name(name):
            irs.add(name)
        if paired and convention_of(companion) is None:
            data.add(companion)
    return irs, data


def _is_openvino_name(name: str) -> bool:
    convention = convention_of(name)
    return convention is not None and convention.layout == "openvino"


def is_package(name: str) -> bool:
    return name.endswith(PACKAGE_SUFFIX) and len(name) > len(PACKAGE_SUFFIX)


def enclosing_package(path: str) -> str | None:
    """The ``.mlpackage`` a clean path lies in (or is), so a file inside one stands for the package."""
    if PACKAGE_SUFFIX not in path:
        return None  # the common case: one substring test
    parts = path.split("/")
    for end in range(len(parts), 0, -1):
        if is_package(parts[end - 1]):
            return "/".join(parts[:end])
    return None


def scan_local_package(directory: str, *, name: str) -> FileScan:
    from guard.inventory.orbax_dirs import MAX_ORBAX_FILES, orbax_files  # a folder's files, bounded, no symlinks
    from guard.readers.coreml.blob import read_mlpackage

    if not os.path.isdir(directory):
        return unreadable(BytesSource(b"", name=name), "a .mlpackage that is not a folder")
    files = orbax_files(directory)
    if len(files) > MAX_ORBAX_FILES:
        return unreadable(BytesSource(b"", name=name), f"more than {MAX_ORBAX_FILES:,} files in the package")
    opened: list[LocalFile] = []

    def open_file(relative: str) -> LocalFile:
        if relative not in files:  # the reader opens only listed files
            raise KeyError(relative)
        opened.append(LocalFile(os.path.join(directory, relative), name=f"{name}/{relative}"))
        return opened[-1]

    try:
        return read_mlpackage(name, files, open_file)
    except READ_FAILURES as exc:
        return unreadable(BytesSource(b"", name=name), exc)
    except OSError as exc:
        return unreadable(BytesSource(b"", name=name), f"read failed ({exc.strerror})")
    finally:
        for source in opened:
            source.close()


def hub_packages(names: Iterable[str]) -> dict[str, dict[str, int | None]]:
    """Package root -> {path relative to it: None} for a Hub listing (sizes are filled by the caller)."""
    out: dict[str, dict[str, int | None]] = {}
    for name in names:
        parts = name.split("/")
        for i, part in enumerate(parts[:-1]):
            if is_package(part):
                out.setdefault("/".join(parts[: i + 1]), {})["/".join(parts[i + 1:])] = None
                break
    return out


def in_package(name: str, roots: Iterable[str]) -> bool:
    return any(name.startswith(root + "/") for root in roots)


def local_weights(directory: str, entries: list[os.DirEntry[str]], weights: list[str]) -> list[str]:
    """``weights`` of one directory with its packages and IR ``.xml`` files in, and the IRs' ``.bin`` out."""
    packages = [e.path for e in entries if is_package(e.name) and e.is_dir(follow_symlinks=False)]
    if not packages and not any(e.name.lower().endswith(".xml") for e in entries):
        return weights
    irs, data = ir_members(e.name for e in entries if e.is_file())
    have = {os.path.basename(w) for w in weights}
    return sorted([w for w in weights if os.path.basename(w) not in data]
                  + [os.path.join(directory, n) for n in irs if n not in have] + packages)
