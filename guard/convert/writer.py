"""Shard-by-shard output into a temporary directory, read back and checked, then renamed into place.

Tensors are produced one at a time by a callback and written straight from their
buffers, so memory holds one tensor (plus its transposed or cast copy), never a shard.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING

from guard import dtypes
from guard.catalogue import make_finding
from guard.convert.io_flax import FlaxWholeFileLoader, write_flax_msgpack
from guard.convert.io_torch import safetensors_header
from guard.convert.naming import Mapped
from guard.errors import GuardError
from guard.findings import Finding
from guard.readers import scan_file
from guard.sources import LocalFile
from guard.tensors import TensorInfo

if TYPE_CHECKING:
    import numpy as np

CRC_BLOCK = 16 * 1024 * 1024
NAMES = {"torch": ("model", ".safetensors"), "flax": ("flax_model", ".msgpack")}


@dataclass(frozen=True)
class OutputTensor:
    mapped: Mapped
    name: str  # joined with "." (torch) or "/" (flax)
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return self.mapped.shape

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, prod(self.shape)) or 0


def plan_shards(tensors: Sequence[OutputTensor], max_shard_size: int) -> list[list[OutputTensor]]:
    """Split in order (source order, so a shard reads few source shards), as transformers does."""
    shards: list[list[OutputTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return shards


def shard_names(to: str, count: int) -> list[str]:
    stem, ext = NAMES[to]
    if count == 1:
        return [stem + ext]
    return [f"{stem}-{i:05d}-of-{count:05d}{ext}" for i in range(1, count + 1)]


def write_shards(directory: Path, shards: list[list[OutputTensor]], *, to: str,
                 produce: Callable[[OutputTensor], np.ndarray],
                 ticks: Callable[[Iterator[OutputTensor]], Iterator[OutputTensor]] = lambda it: it,
                 ) -> dict[str, int]:
    """Write every shard (and the index when there are several); return each tensor's CRC32."""
    import numpy as np

    crcs: dict[str, int] = {}
    shards = ordered_for_writing(shards, to=to)
    names = shard_names(to, len(shards))
    stream = ticks(iter([t for shard in shards for t in shard]))

    def next_array(expected: OutputTensor) -> np.ndarray:
        tensor = next(stream)
        assert tensor is expected, "tensors must be produced in shard order"
        array = np.ascontiguousarray(produce(tensor)).reshape(tensor.shape)  # ascontiguousarray makes 0-d [1]
        if array.shape != tensor.shape or array.nbytes != tensor.nbytes or dtypes_code(array) != tensor.dtype:
            raise AssertionError(f"{tensor.name}: produced {array.dtype} {array.shape}, planned {tensor.dtype} "
                                 f"{tensor.shape}")
        crcs[tensor.name] = zlib.crc32(array.reshape(-1).view(np.uint8).data)
        return array

    for name, shard in zip(names, shards):
        with open(directory / name, "wb") as fh:
            if to == "torch":
                fh.write(safetensors_header([(t.name, t.dtype, t.shape) for t in shard], {"format": "pt"}))
                for tensor in shard:
                    fh.write(next_array(tensor).reshape(-1).view(np.uint8).data)
            else:
                by_key = {tuple(t.name.split("/")): t for t in shard}
                write_flax_msgpack(fh, list(by_key), lambda key: next_array(by_key[key]))
            fh.flush()
            os.fsync(fh.fileno())
    if len(shards) > 1:
        stem, ext = NAMES[to]
        index = {"metadata": {"total_size": sum(t.nbytes for s in shards for t in s)},
                 "weight_map": {t.name: n for n, s in zip(names, shards) for t in s}}
        (directory / f"{stem}{ext}.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return crcs


def dtypes_code(array: np.ndarray) -> str:
    from guard.convert.bitviews import dtype_code

    return dtype_code(array.dtype.name)


def ordered_for_writing(shards: list[list[OutputTensor]], *, to: str) -> list[list[OutputTensor]]:
    """Flax shards are written in sorted key order (nested maps, a depth-first walk); produce in that order."""
    if to == "torch":
        return shards
    return [sorted(shard, key=lambda t: tuple(t.name.split("/"))) for shard in shards]


def verify_written(directory: Path, expected: dict[str, tuple[str, tuple[int, ...], int]],
                   *, to: str) -> tuple[list[Finding], int]:
    """Read the output back: every tensor present once, with its dtype, shape and bytes (CRC32)."""
    stem, ext = NAMES[to]
    seen: dict[str, TensorInfo] = {}
    findings: list[Finding] = []
    for path in sorted(directory.glob(f"{stem}*{ext}")):
        with LocalFile(path) as source:
            scan = scan_file(source)
        findings.extend(make_finding("CG301", path.name, f"written file does not read back: {f.message}")
                        for f in scan.findings)
        seen.update({t.name: t for t in scan.tensors})
    chunked = FlaxWholeFileLoader()
    for name, (code, shape, crc) in sorted(expected.items()):
        info = seen.pop(name, None)
        if info is None or info.dtype != code or info.shape != shape:
            got = "missing" if info is None else f"{info.dtype} {list(info.shape)}"
            findings.append(make_finding("CG301", str(directory), f"{name}: wrote {code} {list(shape)}, read {got}",
                                         tensor=name))
        elif _crc_of(info, chunked) != crc:
            findings.append(make_finding("CG301", Path(info.file).name, f"{name}: bytes changed on disk",
                                         tensor=name))
    findings.extend(make_finding("CG301", Path(i.file).name, f"{n}: written but never planned", tensor=n)
                    for n, i in seen.items())
    return findings, len(expected)


def _crc_of(info: TensorInfo, chunked: FlaxWholeFileLoader) -> int:
    import numpy as np

    if info.data_start is None or info.data_end is None:
        return zlib.crc32(np.ascontiguousarray(chunked.load(info)).reshape(-1).view(np.uint8).data)
    crc = 0
    with open(info.file, "rb") as fh:
        fh.seek(info.data_start)
        left = info.data_end - info.data_start
        while left:
            block = fh.read(min(left, CRC_BLOCK))
            if not block:
                break
            crc = zlib.crc32(block, crc)
            left -= len(block)
    return crc


def make_temp_dir(out: Path) -> Path:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        temp = out.parent / f".{out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
        temp.mkdir()
    except OSError as exc:
        raise GuardError(f"{out}: cannot create the output directory ({exc.strerror})") from None
    return temp


def publish(temp: Path, out: Path) -> None:
    """Rename the finished directory into place (an existing empty ``out`` is replaced)."""
    try:
        os.replace(temp, out)
    except OSError as exc:
        raise GuardError(f"{out}: cannot move the finished output into place ({exc.strerror})") from None


def discard(temp: Path) -> None:
    shutil.rmtree(temp, ignore_errors=True)
