"""File-name conventions: one literal table, pattern -> role, layout and variant.

Every row is a convention a real library writes (transformers ``_add_variant``
and ``save_pretrained`` shard names, diffusers' current and deprecated variant
names, Mistral's and Meta's original layout, PEFT, the Trainer's constants,
Lightning), and each has a test that builds it with that library.  Rules read
the classification below; they never parse names themselves.  Adding a
convention is one row here and one test.
"""

from __future__ import annotations

import posixpath
import re
from typing import NamedTuple

from guard import dtypes

# The stems of one model's format copies (transformers, diffusers).
_HF = r"(?P<stem>model|pytorch_model|flax_model|tf_model|diffusion_pytorch_model|diffusion_flax_model)"
_EXT = r"(?P<ext>safetensors|bin|msgpack|h5)"
# A variant is one dotted component: no dots, no whitespace, bounded (hostile names stay loose files).
_VARIANT = r"(?P<variant>[A-Za-z0-9](?:[A-Za-z0-9_]|-(?!\d{5}-of-\d{5})){0,63})"  # never a shard number
_SHARD = r"(?P<shard>\d{5})-of-(?P<total>\d{5})"


class Convention(NamedTuple):
    pattern: str  # matched against the whole file name
    role: str  # "weights" | "adapter" | "training-state"
    kind: str  # "file" | "shard" | "index" | "part" (model-parallel parts of one set)
    layout: str  # "hf" | "original" | "peft" | "trainer" | "fsdp" | "lightning"
    source: str  # who writes it


CONVENTIONS: tuple[Convention, ...] = (
    # transformers / diffusers: default and variant (`_add_variant` inserts it before the last dot)
    Convention(rf"{_HF}\.{_EXT}\.index\.json", "weights", "index", "hf", "save_pretrained, sharded"),
    Convention(rf"{_HF}\.{_EXT}\.index\.{_VARIANT}\.json", "weights", "index", "hf", "save_pretrained(variant=)"),
    Convention(rf"{_HF}\.{_EXT}\.{_VARIANT}\.index\.json", "weights", "index", "hf", "diffusers, deprecated"),
    Convention(rf"{_HF}\.{_EXT}", "weights", "file", "hf", "save_pretrained"),
    Convention(rf"{_HF}-{_SHARD}\.{_EXT}", "weights", "shard", "hf", "save_pretrained, sharded"),
    Convention(rf"{_HF}\.{_VARIANT}-{_SHARD}\.{_EXT}", "weights", "shard", "hf", "save_pretrained(variant=)"),
    Convention(rf"{_HF}-{_SHARD}\.{_VARIANT}\.{_EXT}", "weights", "shard", "hf", "diffusers, deprecated"),
    Convention(rf"{_HF}\.{_VARIANT}\.{_EXT}", "weights", "file", "hf", "save_pretrained(variant=)"),
    # Mistral's and Meta's original layout, beside the HF-named copies (params.json)
    Convention(r"(?P<stem>consolidated)\.(?P<ext>safetensors)\.index\.json", "weights", "index", "original",
               "mistral"),
    Convention(r"(?P<stem>consolidated)\.(?P<ext>safetensors)", "weights", "file", "original", "mistral"),
    Convention(rf"(?P<stem>consolidated)-{_SHARD}\.(?P<ext>safetensors)", "weights", "shard", "original",
               "mistral"),
    Convention(r"(?P<stem>consolidated)\.(?P<part>\d{2,3})\.(?P<ext>pth)", "weights", "part", "original",
               "meta / mistral model-parallel parts"),
    # PEFT
    Convention(r"(?P<stem>adapter_model)\.(?P<ext>safetensors|bin)", "adapter", "file", "peft", "peft"),
    # Trainer (transformers/trainer.py constants) and accelerate's FSDP full state dict
    Convention(r"(?P<stem>optimizer)\.(?P<ext>pt|bin)", "training-state", "file", "trainer",
               "OPTIMIZER_NAME, OPTIMIZER_NAME_BIN"),
    Convention(r"(?P<stem>scheduler)\.(?P<ext>pt)", "training-state", "file", "trainer", "SCHEDULER_NAME"),
    Convention(r"(?P<stem>scaler)\.(?P<ext>pt)", "training-state", "file", "trainer", "SCALER_NAME"),
    Convention(r"(?P<stem>rng_state(?:_\d{1,6})?)\.(?P<ext>pth)", "training-state", "file", "trainer",
               "rng_state.pth, rng_state_{rank}.pth"),
    Convention(r"(?P<stem>training_args)\.(?P<ext>bin)", "training-state", "file", "trainer",
               "TRAINING_ARGS_NAME"),
    Convention(r"(?P<stem>pytorch_model_fsdp(?:_\d{1,6})?)\.(?P<ext>bin)", "weights", "file", "fsdp",
               "FSDP_MODEL_NAME"),
    # PyTorch Lightning: weights under state_dict, training state beside them in the same file
    Convention(r"(?P<stem>.{1,200})\.(?P<ext>ckpt)", "weights", "file", "lightning", "lightning"),
)

_COMPILED = tuple((re.compile(c.pattern), c) for c in CONVENTIONS)
_LOOSE_SHARD = re.compile(rf"(?P<stem>.{{1,200}})-{_SHARD}\.(?P<ext>[A-Za-z0-9]{{1,12}})")
_LOOSE_INDEX = re.compile(r"(?P<stem>.{1,200})\.(?P<ext>safetensors|bin|msgpack|h5)\.index\.json")

# Suffix -> the set's format family.  Readers report the exact file format (torch-zip, ...).
EXTENSION_FORMATS: dict[str, str] = {
    "safetensors": "safetensors", "bin": "torch", "pt": "torch", "pth": "torch", "ckpt": "torch",
    "msgpack": "flax", "h5": "hdf5", "hdf5": "hdf5", "keras": "keras", "gguf": "gguf", "onnx": "onnx",
    "npz": "numpy", "npy": "numpy",
}
# Weight files that no reader handles yet: CG006, named, never skipped in silence.
UNSUPPORTED_SUFFIXES: dict[str, str] = {
    "gguf": "GGUF", "onnx": "ONNX", "npz": "NumPy", "npy": "NumPy", "tflite": "TensorFlow Lite", "ot": "tch (Rust) / libtorch", "mlmodel": "Core ML",
    "pdparams": "PaddlePaddle", "caffemodel": "Caffe", "nemo": "NeMo", "engine": "TensorRT",
    "plan": "TensorRT", "llamafile": "llamafile", "pb": "TensorFlow graph",
}
# Variants whose name is a dtype (the spellings transformers, diffusers and the Hub use).
DTYPE_VARIANTS: dict[str, str] = {
    "fp16": "F16", "float16": "F16", "f16": "F16", "half": "F16",
    "bf16": "BF16", "bfloat16": "BF16",
    "fp32": "F32", "float32": "F32", "f32": "F32",
    "fp64": "F64", "float64": "F64",
}
# Top-level keys of a Lightning checkpoint that hold training state, not weights.
LIGHTNING_STATE_KEYS = ("optimizer_states", "lr_schedulers", "callbacks", "loops", "native_amp_scaling_state",
                        "MixedPrecision", "hparams", "hyper_parameters")
# Set format order for the primary set: safetensors first, then PyTorch, then Flax, then the rest.
FORMAT_ORDER = ("safetensors", "torch", "flax", "hdf5", "keras", "orbax", "onnx", "gguf", "numpy")
LAYOUT_ORDER = ("hf", "original", "fsdp", "peft", "lightning", "file", "trainer")


class FileRole(NamedTuple):
    name: str  # the file's base name
    role: str
    kind: str
    layout: str  # "file" for names no convention claims
    stem: str
    format: str  # set format family; "" when unknown
    variant: str | None
    shard: tuple[int, int] | None  # (number, total)

    @property
    def variant_dtype(self) -> str | None:
        return DTYPE_VARIANTS.get(self.variant.lower()) if self.variant else None

    @property
    def set_key(self) -> tuple[str, str, str, str, str | None, bool]:
        """Files with the same key make one loadable copy."""
        return (self.role, self.layout, self.stem, self.format, self.variant, self.kind != "file")


def classify(path: str, *, weights: bool = False) -> FileRole:
    """What a file is, from its name alone (no I/O).  Unknown names are loose files of their own set.

    ``weights``: the file was read as weights, so it is never an index, whatever its name says.
    """
    name = posixpath.basename(path)
    if weights and classify(name).kind == "index":
        return _loose(name, indexes=False)
    for regex, conv in _COMPILED:
        match = regex.fullmatch(name)
        if match is None:
            continue
        groups = match.groupdict()
        shard = _shard(groups)
        if shard is None and conv.kind == "shard":
            continue  # "-00000-of-00002": not a shard number, so not this convention
        return FileRole(name, conv.role, conv.kind, conv.layout, groups["stem"],
                        EXTENSION_FORMATS.get(groups["ext"], ""), groups.get("variant"), shard)
    return _loose(name)


def _loose(name: str, *, indexes: bool = True) -> FileRole:
    index = _LOOSE_INDEX.fullmatch(name) if indexes else None
    if index is not None:
        return FileRole(name, "weights", "index", "file", index["stem"], EXTENSION_FORMATS[index["ext"]], None, None)
    ext = name.rpartition(".")[2].lower() if "." in name else ""
    loose = _LOOSE_SHARD.fullmatch(name)
    if loose is not None and _shard(loose.groupdict()) is not None:
        groups = loose.groupdict()
        return FileRole(name, "weights", "shard", "file", groups["stem"], EXTENSION_FORMATS.get(ext, ""), None,
                        _shard(groups))
    stem = name[: -len(ext) - 1] if ext else name
    return FileRole(name, "weights", "file", "file", stem, EXTENSION_FORMATS.get(ext, ""), None, None)


def _shard(groups: dict[str, str | None]) -> tuple[int, int] | None:
    if groups.get("shard") is None or groups.get("total") is None:
        return None
    number, total = int(groups["shard"] or 0), int(groups["total"] or 0)
    return (number, total) if 1 <= number <= total else None


def index_target(path: str) -> FileRole | None:
    """The set an index file describes (its shards' key), or None when it is not an index."""
    role = classify(path)
    return role if role.kind == "index" else None


def claimed_dtype(role: FileRole) -> str | None:
    """The dtype a file's name claims: a dtype variant, or a dtype word in a loose name."""
    if role.variant_dtype:
        return role.variant_dtype
    if role.layout != "file":
        return None
    return name_claimed_dtype(role.name)


_CLAIM = re.compile(r"(?:^|[._-])(fp16|float16|f16|half|bf16|bfloat16|fp32|float32|f32|fp64|f64)(?=$|[._-])",
                    re.IGNORECASE)


def name_claimed_dtype(name: str) -> str | None:
    """``model_fp16.onnx`` -> F16, ``llama-bf16.gguf`` -> BF16, ``x.f16.safetensors`` -> F16."""
    stem = name.rpartition(".")[0] or name
    found = {dtypes.parse_dtype_name(m.group(1)) or DTYPE_VARIANTS.get(m.group(1).lower())
             for m in _CLAIM.finditer(stem[:512])}
    found.discard(None)
    return found.pop() if len(found) == 1 else None
