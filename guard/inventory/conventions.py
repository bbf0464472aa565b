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

from guard.records import Record

# The stems of one model's format copies (transformers, diffusers), and their suffixes.
_HF = frozenset({"model", "pytorch_model", "flax_model", "tf_model", "diffusion_pytorch_model",
                 "diffusion_flax_model"})
HF_EXTENSIONS = frozenset({"safetensors", "bin", "msgpack", "h5"})


class Convention(Record):
    """A name template: dot-separated parts, each a literal or a placeholder.

    ``{stem}`` (one of ``stems``, or anything when None; ``numbered`` also allows ``_N``),
    ``{ext}`` (one of ``exts``), ``{variant}`` (one dotted component, a shard number never),
    ``{part}`` (2-3 digits), and ``{stem}-{shard}`` / ``{variant}-{shard}`` (``-0000k-of-0000n``).
    A first part ``{stem*}`` takes every part before the fixed ones (names with dots).
    """

    template: str
    stems: frozenset[str] | None
    exts: frozenset[str]
    role: str  # "weights" | "adapter" | "training-state"
    kind: str  # "file" | "shard" | "index" | "part" (model-parallel parts of one set)
    layout: str  # "hf" | "original" | "peft" | "trainer" | "fsdp" | "lightning"
    source: str  # who writes it
    numbered: bool = False


_ORIGINAL = frozenset({"consolidated"})
_ST = frozenset({"safetensors"})

CONVENTIONS: tuple[Convention, ...] = (
    # transformers / diffusers: default and variant (`_add_variant` inserts it before the last dot)
    Convention("{stem}.{ext}.index.json", _HF, HF_EXTENSIONS, "weights", "index", "hf", "save_pretrained, sharded"),
    Convention("{stem}.{ext}.index.{variant}.json", _HF, HF_EXTENSIONS, "weights", "index", "hf",
               "save_pretrained(variant=)"),
    Convention("{stem}.{ext}.{variant}.index.json", _HF, HF_EXTENSIONS, "weights", "index", "hf",
               "diffusers, deprecated"),
    Convention("{stem}.{ext}", _HF, HF_EXTENSIONS, "weights", "file", "hf", "save_pretrained"),
    Convention("{stem}-{shard}.{ext}", _HF, HF_EXTENSIONS, "weights", "shard", "hf", "save_pretrained, sharded"),
    Convention("{stem}.{variant}-{shard}.{ext}", _HF, HF_EXTENSIONS, "weights", "shard", "hf",
               "save_pretrained(variant=)"),
    Convention("{stem}-{shard}.{variant}.{ext}", _HF, HF_EXTENSIONS, "weights", "shard", "hf", "diffusers, deprecated"),
    Convention("{stem}.{variant}.{ext}", _HF, HF_EXTENSIONS, "weights", "file", "hf", "save_pretrained(variant=)"),
    # Mistral's and Meta's original layout, beside the HF-named copies (params.json)
    Convention("{stem}.{ext}.index.json", _ORIGINAL, _ST, "weights", "index", "original", "mistral"),
    Convention("{stem}.{ext}", _ORIGINAL, _ST, "weights", "file", "original", "mistral"),
    Convention("{stem}-{shard}.{ext}", _ORIGINAL, _ST, "weights", "shard", "original", "mistral"),
    Convention("{stem}.{part}.{ext}", _ORIGINAL, frozenset({"pth"}), "weights", "part", "original",
               "meta / mistral model-parallel parts"),
    # PEFT
    Convention("{stem}.{ext}", frozenset({"adapter_model"}), frozenset({"safetensors", "bin"}), "adapter", "file",
               "peft", "peft"),
    # Trainer (transformers/trainer.py constants) and accelerate's FSDP full state dict
    Convention("{stem}.{ext}", frozenset({"optimizer"}), frozenset({"pt", "bin"}), "training-state", "file",
               "trainer", "OPTIMIZER_NAME, OPTIMIZER_NAME_BIN"),
    Convention("{stem}.{ext}", frozenset({"scheduler"}), frozenset({"pt"}), "training-state", "file", "trainer",
               "SCHEDULER_NAME"),
    Convention("{stem}.{ext}", frozenset({"scaler"}), frozenset({"pt"}), "training-state", "file", "trainer",
               "SCALER_NAME"),
    Convention("{stem}.{ext}", frozenset({"rng_state"}), frozenset({"pth"}), "training-state", "file", "trainer",
               "rng_state.pth, rng_state_{rank}.pth", numbered=True),
    Convention("{stem}.{ext}", frozenset({"training_args"}), frozenset({"bin"}), "training-state", "file",
               "trainer", "TRAINING_ARGS_NAME"),
    Convention("{stem}.{ext}", frozenset({"pytorch_model_fsdp"}), frozenset({"bin"}), "weights", "file", "fsdp",
               "FSDP_MODEL_NAME", numbered=True),
    # PyTorch Lightning: weights under state_dict, training state beside them in the same file
    Convention("{stem*}.{ext}", None, frozenset({"ckpt"}), "weights", "file", "lightning", "lightning"),
    # optimum-intel's OpenVINO IR exports (the .bin of the same stem is the .xml's data): a set each, an
    # export beside the PyTorch weights rather than a copy of them (layout "openvino", not compared by CG107)
    Convention("{stem}.{ext}", frozenset({"openvino_model", "openvino_encoder_model", "openvino_decoder_model",
                                          "openvino_decoder_with_past_model", "openvino_text_encoder_model",
                                          "openvino_language_model", "openvino_vision_embeddings_model",
                                          "openvino_text_embeddings_model"}),
               frozenset({"xml"}), "weights", "file", "openvino", "optimum-intel (OV_XML_FILE_NAME, ...)"),
)

# Suffix -> the set's format family.  Readers report the exact file format (torch-zip, ...).
EXTENSION_FORMATS: dict[str, str] = {
    "safetensors": "safetensors", "bin": "torch", "pt": "torch", "pth": "torch", "ckpt": "torch", "jit": "torch",
    "ptl": "torch", "pt2": "torch", "pte": "executorch",
    "msgpack": "flax", "h5": "hdf5", "hdf5": "hdf5", "keras": "keras", "gguf": "gguf", "onnx": "onnx",
    "npz": "numpy", "npy": "numpy", "mlpackage": "coreml", "mlmodel": "coreml", "tflite": "tflite",
}
# Weight files that no reader handles yet: CG006, named, never skipped in silence.
UNSUPPORTED_SUFFIXES: dict[str, str] = {
    "gguf": "GGUF", "onnx": "ONNX", "npz": "NumPy", "npy": "NumPy", "ot": "tch (Rust) / libtorch",
    "pdparams": "PaddlePaddle", "caffemodel": "Caffe", "nemo": "NeMo", "engine": "TensorRT",
    "plan": "TensorRT", "llamafile": "llamafile", "pb": "TensorFlow graph",
}
# Top-level keys of a Lightning checkpoint that hold training state, not weights.
LIGHTNING_STATE_KEYS = ("optimizer_states", "lr_schedulers", "callbacks", "loops", "native_amp_scaling_state",
                        "MixedPrecision", "hparams", "hyper_parameters")
# Set format order for the primary set: safetensors first, then PyTorch, then Flax, then the rest.
FORMAT_ORDER = ("safetensors", "torch", "flax", "hdf5", "keras", "orbax", "onnx", "gguf", "numpy", "openvino",
                "coreml", "tensorflow", "tflite", "executorch")
LAYOUT_ORDER = ("hf", "original", "fsdp", "peft", "lightning", "openvino", "file", "trainer")


# Spellings of a dtype in file names, as whole name parts (split at '.', '-', '_').
# q4f16 is transformers.js's name for 4-bit weights with fp16 everywhere else.
NAME_DTYPES: dict[str, str] = {
    "fp32": "F32", "f32": "F32", "float32": "F32",
    "fp16": "F16", "f16": "F16", "float16": "F16", "q4f16": "F16",
    "bf16": "BF16", "bfloat16": "BF16",
    "fp64": "F64", "f64": "F64", "float64": "F64",
}
# Variants whose name is a dtype: the same spellings, and "half", which a variant (the whole name between
# the dots) says on purpose but a loose name may use as a word ("half-cheetah.safetensors").
DTYPE_VARIANTS: dict[str, str] = {**NAME_DTYPES, "half": "F16"}


def name_claimed_dtype(name: str) -> str | None:
    """``model_fp16.onnx`` -> F16, ``llama-bf16.gguf`` -> BF16; None for no claim or two that disagree."""
    base = posixpath.basename(name.replace("\\", "/"))
    stem = (base.rsplit(".", 1)[0] if "." in base else base)[:512].lower()
    claims = {NAME_DTYPES[part] for part in stem.replace("-", ".").replace("_", ".").split(".") if part in NAME_DTYPES}
    return claims.pop() if len(claims) == 1 else None
