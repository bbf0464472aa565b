"""Output into a temporary directory, streamed tensor by tensor, then renamed into place.

Each layout is framing written around tensor bodies: the safetensors header, the
msgpack maps and ext headers, or Orbax's per-leaf ``.zarray`` files.  All of it is
computed from the plan (names, dtypes, shapes), so bodies stream from the source
through ``produce`` to the writer thread in bands, and memory holds one source
tensor plus a few bands, never a shard.  Where every body landed is recorded for
``verify``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

from guard import dtypes
from guard.errors import UsageError
from guard.findings import Finding
from guard.records import Record
from guard.write import orbax_layout
from guard.write.bitviews import dtype_code, numpy_name, storage_dtype
from guard.write.cast import CastCheck
from guard.write.framing import leaf_segments, msgpack_tree, safetensors_header, walk_tree
from guard.write.plan import Mapped
from guard.write.produce import BandPool, PieceCutter, SourceBuffer, body_pieces
from guard.write.publish import fsync_paths
from guard.write.sink import OutputStream

NAMES = {"safetensors": ("model", ".safetensors"), "msgpack": ("flax_model", ".msgpack")}
LAYOUTS = {"torch": ("safetensors",), "flax": ("msgpack", "orbax")}


class Naming(Record):
    """File names as transformers' and diffusers' save_pretrained give them: ``model.fp16.safetensors``,
    ``model.fp16-00001-of-00002.safetensors``, ``model.safetensors.index.fp16.json``."""

    stem: str
    ext: str
    variant: str | None = None

    @classmethod
    def default(cls, layout: str, variant: str | None = None) -> Naming:
        stem, ext = NAMES[layout]
        return cls(stem, ext, variant)

    def shard_names(self, count: int) -> list[str]:
        base = f"{self.stem}.{self.variant}" if self.variant else self.stem
        if count == 1:
            return [base + self.ext]
        return [f"{base}-{i:05d}-of-{count:05d}{self.ext}" for i in range(1, count + 1)]

    @property
    def index_name(self) -> str:
        return f"{self.stem}{self.ext}.index{'.' + self.variant if self.variant else ''}.json"


class OutputTensor(Record):
    mapped: Mapped
    name: str  # joined with "." (torch) or "/" (flax)
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return self.mapped.shape

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, prod(self.shape)) or 0


@dataclass  # mutable: the writer records each tensor's places, CRC and cast findings as it streams
class Written:
    """Where each tensor's body went: (file name in the output directory, offset, length) per segment."""

    places: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    crcs: dict[str, int] = field(default_factory=dict)  # with checksum=True: CRC32 of the bytes handed to write()
    cast_findings: list[Finding] = field(default_factory=list)


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


def shard_names(layout: str, count: int) -> list[str]:
    return Naming.default(layout).shard_names(count)


def ordered_for_writing(shards: list[list[OutputTensor]], *, layout: str) -> list[list[OutputTensor]]:
    """msgpack and Orbax trees are written in sorted key order (a depth-first walk); produce in that order."""
    if layout == "safetensors":
        return shards
    return [sorted(shard, key=lambda t: tuple(t.name.split("/"))) for shard in shards]


def dtypes_code(dtype: Any) -> str:
    """The safetensors code of a numpy dtype, array or dtype name (checked against the plan for every tensor)."""
    return dtype_code(dtype if isinstance(dtype, str) else getattr(dtype, "dtype", dtype).name)


def write_output(directory: Path, shards: list[list[OutputTensor]], *, layout: str,
                 ticks: Callable[[Iterator[OutputTensor]], Iterator[OutputTensor]] = lambda it: it,
                 checksum: bool = False, naming: Naming | None = None) -> Written:
    """Write every file of ``layout`` into ``directory``; all of it fsynced when this returns.

    ``naming`` gives the files other names than convert's (``model.safetensors``, ``flax_model.msgpack``):
    a variant's, or diffusers' ``diffusion_pytorch_model``.
    """
    if layout == "orbax":
        shards = [[t for shard in shards for t in shard]]  # one tree; --max-shard-size does not apply
        _check_orbax_names(shards[0])
    shards = ordered_for_writing(shards, layout=layout)
    stream = OutputStream(checksum=checksum)
    emitter = _Emitter(stream, ticks(iter([t for shard in shards for t in shard])))
    try:
        if layout == "orbax":
            _write_orbax(directory, shards[0], stream, emitter)
        else:
            _write_files(directory, shards, layout, stream, emitter, naming or Naming.default(layout))
        stream.finish()
    except BaseException:
        stream.abort()
        raise
    emitter.written.crcs = stream.crcs
    fsync_paths([directory, *(p for p in directory.iterdir() if p.is_dir())])
    return emitter.written


def _check_orbax_names(tensors: list[OutputTensor]) -> None:
    """Every leaf gets a directory of its own inside the checkpoint (orbax joins keys with ".")."""
    seen: dict[str, str] = {}
    for tensor in tensors:
        where = f"{tensor.mapped.source.info.file}: {tensor.mapped.source.name}"
        try:
            name = orbax_layout.array_dir(tuple(tensor.name.split("/")))
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}") from None
        if name in seen:
            raise UsageError(f"{where}: {tensor.name} and {seen[name]} would share the Orbax array {name}")
        seen[name] = tensor.name


def _write_files(directory: Path, shards: list[list[OutputTensor]], layout: str, stream: OutputStream,
                 emitter: _Emitter, naming: Naming) -> None:
    names = naming.shard_names(len(shards))
    for name, shard in zip(names, shards):
        stream.open(directory / name)
        if layout == "safetensors":
            stream.write(safetensors_header([(t.name, t.dtype, t.shape) for t in shard], {"format": "pt"}))
            for tensor in shard:
                emitter.tensor(tensor, name, [(b"", tensor.nbytes)])
        else:
            by_key = {tuple(t.name.split("/")): t for t in shard}

            def leaf(key: tuple[str, ...], file: str = name, by_key: dict = by_key) -> None:
                t = by_key[key]  # the leaf's dtype name is flax's dtype.name; its bytes are only moved
                emitter.tensor(t, file, leaf_segments(t.shape, numpy_name(t.dtype), storage_dtype(t.dtype).itemsize))

            walk_tree(msgpack_tree(list(by_key)), stream.write, leaf)
        stream.close()
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for s in shards for t in s)},
                 "weight_map": {t.name: n for n, s in zip(names, shards) for t in s}}
        _small_file(stream, directory / naming.index_name,
                    (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())


def _write_orbax(directory: Path, tensors: list[OutputTensor], stream: OutputStream, emitter: _Emitter) -> None:
    started = time.time_ns()
    for tensor in tensors:
        key = tuple(tensor.name.split("/"))
        leaf_dir = orbax_layout.array_dir(key)
        (directory / leaf_dir).mkdir()
        _small_file(stream, directory / leaf_dir / ".zarray", orbax_layout.zarray(tensor.dtype, tensor.shape))
        chunk = f"{leaf_dir}/{orbax_layout.chunk_name(len(tensor.shape))}"
        if tensor.nbytes:
            stream.open(directory / chunk)
        emitter.tensor(tensor, chunk, [(b"", tensor.nbytes)])
        if tensor.nbytes:
            stream.close()
    keys = [tuple(t.name.split("/")) for t in tensors]
    _small_file(stream, directory / orbax_layout.METADATA, orbax_layout.tree_metadata(keys))
    _small_file(stream, directory / orbax_layout.CHECKPOINT_METADATA,
                orbax_layout.checkpoint_metadata(started, time.time_ns()))


def _small_file(stream: OutputStream, path: Path, data: bytes) -> None:
    stream.open(path)
    stream.write(data)
    stream.close()


class _Emitter:
    """Streams each tensor's pieces into the framing's segments, exactly as many bytes as planned."""

    def __init__(self, stream: OutputStream, order: Iterator[OutputTensor]) -> None:
        self.stream, self.order = stream, order
        self.pool, self.source = BandPool(), SourceBuffer()
        self.written = Written()

    def tensor(self, tensor: OutputTensor, file: str, segments: list[tuple[bytes, int]]) -> None:
        assert next(self.order) is tensor, "tensors must be produced in the order they are written"
        src = tensor.mapped.source
        if dtypes_code(numpy_name(tensor.dtype)) != tensor.dtype:
            raise AssertionError(f"{tensor.name}: planned {tensor.dtype} has no numpy dtype of that code")
        check = CastCheck(tensor.dtype) if tensor.dtype != src.info.dtype else None
        pieces = PieceCutter(body_pieces(src, tensor.mapped.perm, tensor.dtype, pool=self.pool, source=self.source,
                                     check=check), tensor.name)
        places = self.written.places.setdefault(tensor.name, [])
        for framing, size in segments:
            if framing:
                self.stream.write(framing)
            places.append((file, self.stream.position, size))
            self.stream.begin(tensor.name)
            pieces.emit(size, self.stream)
            self.stream.end()
        pieces.done()
        finding = check.finding(name=tensor.name, path=src.info.file) if check is not None else None
        if finding is not None:
            self.written.cast_findings.append(finding)
