"""The trainers: one literal row each, saying how a checkpoint is recognised, scanned and converted.

A row names its code by dotted ``module:function`` strings, imported on first use (``guard.lazy``), so that
this table imports nothing beyond ``guard.records``: discovery reads the markers on every scan, the
pre-commit hook's included, and imports a trainer's reader only where a marker is seen.  The conversion
code sits in ``guard.convert.training``, above ``guard.write``; the strings keep this package below it.

A trainer's pickles are walked by the one allow-list walker (``guard.training.pickles``) with the row's
``PickleGlobals``: the classes it may hold, built as inert records (name, call arguments, BUILD's state),
never imported or called; any other global is CG003.
"""

from __future__ import annotations

from collections.abc import Iterable

from guard.records import Record


class Markers(Record):
    """Names that make a directory worth asking the trainer's ``claim``: a suffix, a prefix or a whole name."""

    suffixes: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    names: tuple[str, ...] = ()


class PickleGlobals(Record):
    """The globals one of a trainer's pickles may hold, beyond the shared list it starts from."""

    pickle: str  # which file holds the pickle
    records: frozenset[str]  # classes of plain values: each call is an inert record, never made
    values: frozenset[str] = frozenset()  # other globals, described as the shared walker describes them
    # the shared list: "weights-only" (torch.load's, with its Python 2 name mapping) or "dtypes" (torch's dtypes)
    base: str = "weights-only"
    # (global, the first arguments it accepts, what those are): any other is refused, as the class refuses it
    accepts: tuple[tuple[str, tuple[object, ...], str], ...] = ()


class Trainer(Record):
    layout: str  # the training-state set's layout (``TrainingState.layout``)
    writes: str  # who writes it, and what
    markers: Markers
    claim: str  # ``claim(directory, names) -> TrainingDir | None``: by names alone, no I/O beyond what it must see
    scan: str  # ``scan(found, *, name) -> FileScan``: the directory read, every problem a finding naming its file
    pickles: tuple[PickleGlobals, ...] = ()
    # ``convert``: a module with ``find_checkpoint(src) -> (checkpoint, config folder) | None`` and
    # ``open_checkpoint(checkpoint) -> SourceModel``; None: the trainer's checkpoints are not converted
    source: str | None = None
    # ``(source, config) -> source``: the trainer's own names as HF's, each unchanged where the checkpoint is
    # not its model; applied to a checkpoint its ``source`` opened
    adapters: tuple[str, ...] = ()


_DCP = "torch.distributed.checkpoint"
_MCORE = "megatron.core"
_MEM_FORMATS = (0, 1, 2)  # _MEM_FORMAT_ENCODING: contiguous, channels_last, preserve
# str() of each torch.layout (torch.serialization._get_layout's table in torch 2.13)
TORCH_LAYOUTS = ("torch.strided", "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc", "torch.sparse_bsr",
                 "torch.sparse_bsc", "torch._mkldnn", "torch.jagged")

# torch writes `.metadata` with pickle.dump and reads it with plain pickle.load (pytorch/pytorch#189308)
DCP_METADATA = PickleGlobals(
    ".metadata",
    records=frozenset({  # dataclasses, a NamedTuple, enums
        *(f"{_DCP}.metadata.{name}" for name in (
            "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
            "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")),
        f"{_DCP}.filesystem._StorageInfo",
        f"{_DCP}._extension.ExtensionTransformEntry",
        "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",  # older torch
        "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
        *(f"{_DCP}.planner.{name}" for name in (  # Megatron 0.16 keeps its plans in the metadata
            "SavePlan", "WriteItem", "TensorWriteData", "WriteItemType", "BytesIOWriteData")),
        f"{_MCORE}.dist_checkpointing.strategies.torch.MCoreMetadata",  # older Megatron
        f"{_MCORE}.dist_checkpointing.strategies.torch.MCoreSavePlan",
    }),
    values=frozenset({  # only name a value the records hold
        "torch.Size", "torch.serialization._get_layout", "pathlib.PosixPath", "pathlib.WindowsPath",
        "pathlib.PurePosixPath", "collections.OrderedDict", "builtins.set", "builtins.frozenset",
    }),
    base="dtypes",
    accepts=(
        (f"{_DCP}.metadata._MEM_FORMAT_ENCODING", _MEM_FORMATS, "a memory format torch encodes"),
        ("torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING", _MEM_FORMATS,
         "a memory format torch encodes"),
        ("torch.serialization._get_layout", TORCH_LAYOUTS, "a torch layout"),  # torch's lookup raises KeyError
    ),
)
# DeepSpeed's torch zips: the loss scaler, the ZeRO stage and param_slice_mappings' fragment addresses (numbers)
DEEPSPEED_STATES = PickleGlobals("*_model_states.pt, *_optim_states.pt", frozenset({
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
}))
# dist_checkpointing.save's non-sharded state, read back with torch.load(weights_only=False): Megatron's
# training loop keeps its `args` there (numbers, strings, a torch dtype and these enums)
MEGATRON_COMMON = PickleGlobals("common.pt", frozenset({
    "argparse.Namespace",
    f"{_MCORE}.enums.ModelType",  # args.model_type
    f"{_MCORE}.transformer.enums.AttnBackend",  # args.attention_backend
    f"{_MCORE}.transformer.enums.AttnMaskType",
    f"{_MCORE}.transformer.enums.LayerType",
    f"{_MCORE}.enums.Fp8Recipe",
}))

_DCP_SOURCE = "guard.convert.training.dcp"

# Claims are asked in this order; ``convert`` tries each source once, in this order.
TRAINERS: tuple[Trainer, ...] = (
    Trainer("dcp", "PyTorch Distributed Checkpoint (FSDP2, torchtitan, Accelerate, the HF storage writer)",
            Markers(suffixes=(".distcp", ".metadata"),  # __R_N.distcp, .metadata, __R.metadata
                    prefixes=("shard-",)),  # HuggingFaceStorageWriter: shard-0000K-model-0000I-of-0000N.safetensors
            "guard.training.dcp.dirs:claim", "guard.training.dcp.dirs:scan", (DCP_METADATA,),
            _DCP_SOURCE, ("guard.convert.training.torchtitan:from_torchtitan",)),  # names and q/k RoPE order
    Trainer("deepspeed", "DeepSpeed ZeRO 1-3: <tag>/*_model_states.pt, *_optim_states.pt, `latest` beside",
            Markers(suffixes=("_model_states.pt", "_optim_states.pt"),  # {bf16_}zero_pp_rank_R_mp_rank_00_...
                    names=("latest",)),  # the save folder: `latest` names the newest tag folder (CG119 when none)
            "guard.training.deepspeed.dirs:claim", "guard.training.deepspeed.dirs:scan", (DEEPSPEED_STATES,),
            "guard.convert.training.deepspeed"),
    # An iteration folder is torch_dist (DCP's files, metadata.json and common.pt), claimed by the dcp row, which
    # walks common.pt with MEGATRON_COMMON; the save folder is claimed here only when its tracker names nothing
    Trainer("megatron", "Megatron-core's save folder: latest_checkpointed_iteration.txt, iter_NNNNNNN/ (torch_dist)",
            Markers(names=("latest_checkpointed_iteration.txt",)),
            "guard.training.megatron.dirs:claim", "guard.training.megatron.dirs:scan", (MEGATRON_COMMON,),
            _DCP_SOURCE, ("guard.convert.training.megatron:from_megatron",)),  # layers unstacked, qkv/fc1 split
)

_SUFFIXES = tuple(s for trainer in TRAINERS for s in trainer.markers.suffixes)
_PREFIXES = tuple(p for trainer in TRAINERS for p in trainer.markers.prefixes)
_NAMES = frozenset(n for trainer in TRAINERS for n in trainer.markers.names)


def has_training_marker(names: Iterable[str]) -> bool:
    """Whether any name is a trainer's marker: only then are the trainers' claims imported and asked."""
    return any(n.endswith(_SUFFIXES) or n.startswith(_PREFIXES) or n in _NAMES for n in names)


def trainer(layout: str) -> Trainer:
    return next(t for t in TRAINERS if t.layout == layout)


def pickle_globals(layout: str, pickle: str) -> PickleGlobals:
    return next(p for p in trainer(layout).pickles if p.pickle == pickle)
