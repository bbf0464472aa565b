"""A DCP checkpoint as a conversion source: the model's tensors, whole, as ``dcp_to_torch_save`` would load them.

Each tensor chunk in a ``.distcp`` is a complete ``torch.save`` zip at the byte range ``.metadata`` gives;
its ``data.pkl`` (walked, never unpickled) places the chunk in the zip's ``data/`` record.  A tensor is
assembled when the writer asks for it, chunk by chunk into one fresh array: peak memory is about the
tensor plus one chunk, whatever the model's size, and the optimizer's items are never read.  The model's
own keys are used (the ``model`` container, ``_orig_mod.`` and ``module.`` stripped).  A checkpoint with
a problem (CG001, CG003, CG114-CG117) gives its findings and no tensor, so nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from guard.catalogue import make_finding
from guard.convert.read.source import SourceModel
from guard.errors import MalformedCheckpoint
from guard.findings import Finding
from guard.readers import READ_FAILURES
from guard.sources import LocalFile
from guard.tensors import TensorInfo
from guard.training.dcp.dirs import claim, folder_sizes, read_metadata, scan
from guard.training.dcp.hf_shards import is_hf_shard, read_hf_shards
from guard.training.dcp.layout import DcpChunk, DcpStorage
from guard.training.dcp.roles import item_role, publish_kind
from guard.training.megatron.dirs import NEMO_CONTEXT, NEMO_WEIGHTS, TRACKER, read_tracker
from guard.training.state import model_key
from guard.write.plan import SourceTensor

if TYPE_CHECKING:
    import numpy as np

FORMAT = "dcp"
# Accelerate's save_state with FSDP SHARDED_STATE_DICT: the first model's DCP folder (optimizer_0/ beside it)
ACCELERATE_MODEL = "pytorch_model_fsdp_0"


def find_checkpoint(src: Path) -> tuple[Path, Path] | None:
    """(the DCP folder, the folder whose config.json describes the model), or None: not a DCP checkpoint."""
    if not src.is_dir():
        return None
    names = frozenset(p.name for p in src.iterdir() if p.is_file())
    if claim(str(src), names) is None:
        if (src / ACCELERATE_MODEL).is_dir():  # Accelerate's save_state folder: the model beside optimizer_0/
            return find_checkpoint(src / ACCELERATE_MODEL)
        if (src / NEMO_WEIGHTS).is_dir() and (src / NEMO_CONTEXT).is_dir():  # NeMo 2: <ckpt>/weights/
            inner = find_checkpoint(src / NEMO_WEIGHTS)
            return None if inner is None else (inner[0], src if "config.json" in names else inner[1])
        tracked = read_tracker(str(src)) if TRACKER in names else None  # Megatron's save folder: its newest save
        if tracked is None:
            return None
        if tracked.problem is not None:
            return src / TRACKER, src  # named, so that the source says CG119
        assert tracked.folder is not None  # set when problem is None (the tracker's parse)
        inner = find_checkpoint(src / tracked.folder)
        return None if inner is None else (inner[0], src if "config.json" in names else inner[1])
    return src, src if "config.json" in names else src.parent


def open_checkpoint(folder: Path) -> SourceModel:
    model = SourceModel("torch", FORMAT, [], None)
    name = str(folder)
    if folder.name == TRACKER:
        tracked = read_tracker(str(folder.parent))
        problem = tracked.problem if tracked is not None and tracked.problem else f"{TRACKER} names no iteration"
        model.findings.append(make_finding("CG119", name, f"{problem}; nothing to consolidate"))
        return model
    found = claim(name, frozenset(p.name for p in folder.iterdir() if p.is_file()))
    assert found is not None
    scanned = scan(found, name=name)  # the scan's own checks: a bad checkpoint is refused before any read
    model.findings += [f for f in scanned.findings if f.severity.value == "error"]
    if model.findings:
        return model
    meta = read_metadata(str(folder), folder_sizes(str(folder)), name=name).metadata
    if meta is None:  # the HF storage writer's shards: no .metadata, each piece placed by its saved_offsets
        return _hf_shards(model, folder, [n for n in found.claimed if is_hf_shard(n)])
    storage = {(s.fqn, s.offset): s for s in meta.storage}
    placed: dict[str, tuple[str, tuple[int, ...], list[tuple[DcpChunk, DcpStorage]]]] = {}
    publishes = publish_kind(meta)  # the masters where it holds them (Megatron's fp32_param), else the module
    for item in meta.items:
        if item.shape is None or item.dtype is None:
            continue
        kind, key = item_role(item)
        if kind != publishes or key in placed:
            continue
        placed[key] = (item.dtype, item.shape, [(c, storage[(item.fqn, c.offsets)]) for c in item.chunks])
    if not placed:
        model.findings.append(make_finding("CG001", name, "the DCP checkpoint holds no model tensor (only optimizer "
                                           "or other state): nothing to consolidate"))
        return model
    model.files = [folder / f for f in sorted({s.file for _, _, pieces in placed.values() for _, s in pieces})]
    loader = ChunkLoader(folder, {k: (v[0], v[2]) for k, v in placed.items()})
    model.findings += loader.check()  # every chunk's data.pkl walked before a byte is written
    if model.findings:
        return model
    for key, (dtype, shape, _) in placed.items():
        model.tensors.append(SourceTensor(TensorInfo(key, dtype, shape, name), loader))
    return model


def _hf_shards(model: SourceModel, folder: Path, names: list[str]) -> SourceModel:
    read = read_hf_shards(str(folder), names, name=str(folder))
    model.findings += [f for f in read.findings if f.severity.value == "error"]
    if model.findings:
        return model
    model.files = [folder / n for n in sorted(names)]
    loader = PieceLoader({model_key((fqn,)): held for fqn, held in read.pieces.items()})
    for tensor in read.state.weights:
        model.tensors.append(SourceTensor(tensor, loader))
    return model


class PieceLoader:
    """Assembles a tensor from the ranks' safetensors pieces, each a plain byte range of its shard."""

    def __init__(self, pieces: dict[str, list[tuple[TensorInfo, tuple[int, ...]]]]) -> None:
        self.pieces = pieces

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        from guard.write.bitviews import numpy_dtype

        dtype = numpy_dtype(info.dtype)
        whole = np.empty(info.shape, dtype)
        for piece, offsets in self.pieces[info.name]:
            assert piece.data_start is not None and piece.data_end is not None
            with LocalFile(piece.file, name=piece.file) as source:
                data = source.read_at(piece.data_start, piece.data_end - piece.data_start)
            whole[tuple(slice(o, o + n) for o, n in zip(offsets, piece.shape))] = \
                np.frombuffer(data, dtype).reshape(piece.shape)
        return whole


class ChunkLoader:
    """Assembles a tensor from its chunks' torch.save records; holds nothing between tensors.

    ``check`` walks every chunk's record first (zip directory and data.pkl, never unpickled): a record
    that is not one plain tensor of the shape and dtype ``.metadata`` gives is a finding, and nothing is
    read from a checkpoint with one; ``load`` then reads each chunk's bytes where its record placed them.
    """

    def __init__(self, folder: Path, tensors: dict[str, tuple[str, list[tuple[DcpChunk, DcpStorage]]]]) -> None:
        self.folder = folder
        self.tensors = tensors
        self.records: dict[tuple[str, int], TensorInfo] = {}  # (file, start) -> the chunk's tensor, placed in it

    def check(self) -> list[Finding]:
        findings: list[Finding] = []
        for key, (dtype, chunks) in self.tensors.items():
            for chunk, stored in chunks:
                problem = self._walk(stored, key, dtype, chunk.sizes)
                if problem is not None:
                    findings.append(problem)
                    if len(findings) >= 10:
                        return findings
        return findings

    def _walk(self, stored: DcpStorage, key: str, dtype: str, sizes: tuple[int, ...]) -> Finding | None:
        from guard.readers.torch.zip import read_torch_zip

        shown = f"{self.folder}/{stored.file}"
        with LocalFile(self.folder / stored.file, name=shown) as source:
            window = Window(source, stored.start, stored.length)
            try:
                record = read_torch_zip(window, locate_data=True)
            except READ_FAILURES as exc:
                return make_finding("CG001", shown, f"the record of {key} at byte {stored.start:,} is not a "
                                    f"torch.save zip: {str(exc).splitlines()[0][:200] if str(exc) else exc!r}",
                                    tensor=key)
        unsafe = [f for f in record.findings if f.code == "CG003"]
        if unsafe:
            return unsafe[0]._replace(path=shown, tensor=key)
        tensor = record.tensors[0] if len(record.tensors) == 1 and not record.findings else None
        if tensor is None or tensor.shape != sizes or tensor.dtype != dtype or tensor.data_start is None:
            held = f"{tensor.dtype} {list(tensor.shape)}" if tensor is not None else "not one plain tensor"
            return make_finding("CG001", shown, f"the record of {key} at byte {stored.start:,} holds {held}; "
                                f".metadata says {dtype} {list(sizes)}", tensor=key)
        self.records[(stored.file, stored.start)] = tensor
        return None

    def load(self, info: TensorInfo) -> np.ndarray:
        import numpy as np

        from guard.write.bitviews import numpy_dtype

        dtype = numpy_dtype(info.dtype)
        whole = np.empty(info.shape, dtype)
        for chunk, stored in self.tensors[info.name][1]:
            piece = self._chunk(stored, dtype, chunk.sizes)
            whole[tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes))] = piece
        return whole

    def load_slab(self, info: TensorInfo, index: int) -> np.ndarray:
        """``tensor[index]`` along its first axis, from the chunks that hold it alone (Megatron's stacked
        layers: one layer's rows of each, without assembling the whole stack)."""
        import numpy as np

        from guard.write.bitviews import numpy_dtype

        dtype = numpy_dtype(info.dtype)
        slab = np.empty(info.shape[1:], dtype)
        for chunk, stored in self.tensors[info.name][1]:
            first, rows = chunk.offsets[0], chunk.sizes[0]
            if not first <= index < first + rows:
                continue
            piece = self._chunk(stored, dtype, chunk.sizes)[index - first]
            slab[tuple(slice(o, o + n) for o, n in zip(chunk.offsets[1:], chunk.sizes[1:]))] = piece
        return slab

    def _chunk(self, stored: DcpStorage, dtype: np.dtype, sizes: tuple[int, ...]) -> np.ndarray:
        import numpy as np

        tensor = self.records[(stored.file, stored.start)]
        assert tensor.data_start is not None and tensor.data_end is not None
        with LocalFile(self.folder / stored.file, name=f"{self.folder}/{stored.file}") as source:
            data = Window(source, stored.start, stored.length).read_at(tensor.data_start,
                                                                     tensor.data_end - tensor.data_start)
        flat = np.frombuffer(data, dtype)
        if tensor.stride is None:
            return flat.reshape(sizes)
        strides = tuple(s * dtype.itemsize for s in tensor.stride)
        return np.lib.stride_tricks.as_strided(flat, shape=sizes, strides=strides, writeable=False)


class Window:
    """The bytes [start, start + length) of a file, as a source of their own (one item of a .distcp)."""

    def __init__(self, source: LocalFile, start: int, length: int) -> None:
        self.source, self.start, self.size = source, start, length
        self.name = f"{source.name}@{start}"

    def read_at(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise MalformedCheckpoint(f"{self.name}: a read of {size} bytes at {offset} leaves the item's "
                                      f"{self.size:,} bytes")
        return self.source.read_at(self.start + offset, size)

