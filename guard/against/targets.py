"""The JAX stacks ``parity --against`` checks: one literal row each.

A row names the library and the version it is checked against, where it runs (an environment of its
own when its pins conflict with ours), the loads it is run with (its defaults, what most users run,
and its recommended exact options), and per architecture the name/tree mapping from a Hugging Face
tensor to the parameter the library holds, as data.  Each mapping is written from the library's own
conversion code, cited by file and function.

A mapping step is ``("transpose", axes)`` (``None``: all axes reversed, numpy's default) or
``("reshape", dims)``, ``dims`` naming config.json keys (``head_dim`` falls back to
hidden_size / num_attention_heads, as transformers does).  The library's name is a template whose
``{i}`` is the layer index the Hugging Face name carried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard.against import easydel_causes, maxtext_causes
from guard.convert.maxtext.table import ARCHITECTURES as MAXTEXT_ROWS

T = ("transpose", (1, 0))
T_ALL = ("transpose", None)


@dataclass(frozen=True)
class Load:
    label: str  # "defaults" | "exact"
    options: dict[str, Any]  # passed to the library's loader by the worker
    says: str  # the option, as the library spells it, that a finding under the other load names
    when_stored: tuple[str, ...] = ()  # run only for a file stored in one of these dtypes (empty: always)


@dataclass(frozen=True)
class Target:
    name: str
    library: str  # the PyPI distribution
    version: str  # the version the mapping was written from and the tests run
    cites: str  # the library's conversion code the mappings follow
    environment: str  # the venv the worker runs in, relative to the repository root
    make_target: str  # builds that environment
    loads: tuple[Load, ...]
    architectures: dict[str, tuple[tuple[str, str, tuple[Any, ...]], ...]] = field(default_factory=dict)
    needs: str = ""  # one line: what the environment holds and why it is apart
    runs_beside: bool = False  # environment is a library folder put on this Python's path, not a venv
    module: str = ""  # runs_beside: the import name; already importable here, the folder is not needed
    env: dict[str, str] = field(default_factory=dict)  # the worker's environment variables
    # the library reads no HF file: the checkpoint is converted first (``convert --to <converts_to>``, in a
    # temporary directory) and the mapping is that converter's table, not ``architectures``' rows
    converts_to: str = ""
    exact_load: str = "exact"  # the load whose options a finding under another load names
    # (config.json, a load's options, a failing comparison's dtype) -> what the library's forward is known to
    # do differently there, one clause each, added to that forward finding
    forward_causes: Callable[[dict[str, Any], dict[str, Any], str], tuple[str, ...]] | None = None
    # (file, config.json, input ids) -> transformers' fp32 outputs with the library's declared forward
    # conventions in them, or None where none apply: an fp32 miss that this reference does not see is the
    # conventions only (a warning); one it sees too is something else (CG302)
    conventional_reference: Callable[[Path, dict[str, Any], Any], dict[str, Any] | None] | None = None


# HF name (regex, layer index as the first group) -> library name, steps.
_TUNIX_DECODER = (
    (r"model\.embed_tokens\.weight", "embedder.input_embedding", ()),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", "layers.{i}.attn.q_proj.w",
     (T, ("reshape", ("hidden_size", "num_attention_heads", "head_dim")))),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", "layers.{i}.attn.k_proj.w",
     (T, ("reshape", ("hidden_size", "num_key_value_heads", "head_dim")))),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", "layers.{i}.attn.v_proj.w",
     (T, ("reshape", ("hidden_size", "num_key_value_heads", "head_dim")))),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", "layers.{i}.attn.o_proj.w",
     (T, ("reshape", ("num_attention_heads", "head_dim", "hidden_size")))),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", "layers.{i}.mlp.gate_proj.kernel", (T,)),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", "layers.{i}.mlp.up_proj.kernel", (T,)),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", "layers.{i}.mlp.down_proj.kernel", (T,)),
    (r"model\.norm\.weight", "final_norm.w", ()),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "layers.{i}.input_layernorm.w", ()),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "layers.{i}.post_attention_layernorm.w", ()),
    (r"lm_head\.weight", "lm_head.w", (T,)),
)
_TUNIX_QK_NORM = (
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", "layers.{i}.attn.q_norm.w", ()),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", "layers.{i}.attn.k_norm.w", ()),
)

# keras-hub's port_weight hooks: np.transpose (all axes) then reshape to the Keras variable's shape.
_KERAS_DECODER = (
    (r"model\.embed_tokens\.weight", "token_embedding/embeddings", ()),
    (r"lm_head\.weight", "token_embedding/reverse_embeddings", (T,)),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "transformer_layer_{i}/self_attention_layernorm/scale", ()),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "transformer_layer_{i}/feedforward_layernorm/scale",
     ()),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", "transformer_layer_{i}/self_attention/query/kernel",
     (T_ALL, ("reshape", ("hidden_size", "num_attention_heads", "head_dim")))),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", "transformer_layer_{i}/self_attention/key/kernel",
     (T_ALL, ("reshape", ("hidden_size", "num_key_value_heads", "head_dim")))),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", "transformer_layer_{i}/self_attention/value/kernel",
     (T_ALL, ("reshape", ("hidden_size", "num_key_value_heads", "head_dim")))),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight",
     "transformer_layer_{i}/self_attention/attention_output/kernel",
     (T_ALL, ("reshape", ("num_attention_heads", "head_dim", "hidden_size")))),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", "transformer_layer_{i}/feedforward_gate_dense/kernel", (T,)),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", "transformer_layer_{i}/feedforward_intermediate_dense/kernel",
     (T,)),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", "transformer_layer_{i}/feedforward_output_dense/kernel", (T,)),
    (r"model\.norm\.weight", "sequence_output_layernorm/scale", ()),
)
_KERAS_QK_NORM = (
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight",
     "transformer_layer_{i}/self_attention/query_dense_layernorm/scale", ()),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight",
     "transformer_layer_{i}/self_attention/key_dense_layernorm/scale", ()),
)

# EasyDeL's StateDictConverter.process_tensor: ``weight`` of a Linear -> ``kernel`` transposed, of an
# Embedding -> ``embedding``, of a norm -> ``kernel``; the rest of the name is the HF name.
_EASYDEL_DECODER = (
    (r"model\.embed_tokens\.weight", "model.embed_tokens.embedding", ()),
    *((rf"model\.layers\.(\d+)\.self_attn\.{p}_proj\.weight", f"model.layers.{{i}}.self_attn.{p}_proj.kernel", (T,))
      for p in "qkvo"),
    *((rf"model\.layers\.(\d+)\.mlp\.{p}_proj\.weight", f"model.layers.{{i}}.mlp.{p}_proj.kernel", (T,))
      for p in ("gate", "up", "down")),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "model.layers.{i}.input_layernorm.kernel", ()),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "model.layers.{i}.post_attention_layernorm.kernel",
     ()),
    (r"model\.norm\.weight", "model.norm.kernel", ()),
    (r"lm_head\.weight", "lm_head.kernel", (T,)),
)
_EASYDEL_QK_NORM = (
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", "model.layers.{i}.self_attn.q_norm.kernel", ()),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", "model.layers.{i}.self_attn.k_norm.kernel", ()),
)

TARGETS: dict[str, Target] = {
    "tunix": Target(
        name="tunix", library="google-tunix", version="0.1.7",
        cites=("tunix/models/{llama3,qwen3}/params.py: _get_key_and_transform_mapping and "
               "create_model_from_safe_tensors; tunix/models/safetensors_loader.py: load_and_create_model"),
        environment=".venv-tunix", make_target="make tunix-venv",
        loads=(Load("defaults", {"mode": "auto"}, 'mode="auto" (the optimized loader on Linux)'),
               Load("exact", {"mode": "original"}, 'mode="original"')),
        architectures={"llama": _TUNIX_DECODER, "qwen3": _TUNIX_DECODER + _TUNIX_QK_NORM},
        needs="google-tunix 0.1.7 pins safetensors < 0.8 (ours is 0.8): a venv of its own"),
    "keras-hub": Target(
        name="keras-hub", library="keras-hub", version="0.32.0",
        cites=("keras_hub/src/utils/transformers/convert_{llama3,qwen3}.py: convert_weights; "
               "keras_hub/src/utils/transformers/safetensor_utils.py: SafetensorLoader.port_weight"),
        environment=".keras-hub", make_target="make keras-hub-lib",
        loads=(Load("defaults", {}, "no dtype (Keras' global policy)"),
               Load("exact", {"dtype": "float32"}, 'dtype="float32"'),
               # what keras-hub users run for a bf16 checkpoint: variables and compute in bf16
               Load("bfloat16 policy", {"dtype": "bfloat16"}, 'dtype="bfloat16"', when_stored=("BF16",))),
        architectures={"llama": _KERAS_DECODER, "qwen3": _KERAS_DECODER + _KERAS_QK_NORM},
        needs=("keras-hub 0.32 installed --no-deps beside the main venv (its tensorflow-text would pull a second "
               "TensorFlow over tensorflow-cpu); run with KERAS_BACKEND=jax"),
        runs_beside=True, module="keras_hub", env={"KERAS_BACKEND": "jax"}),
    "easydel": Target(
        name="easydel", library="easydel", version="0.3.0",
        cites=("easydel/utils/parameters_transformation.py: StateDictConverter.process_tensor; "
               "easydel/infra/mixins/bridge.py: _from_torch_pretrained"),
        environment=".venv-easydel", make_target="make easydel-venv",
        loads=(Load("defaults", {}, 'torch_load_mode="full" (loads through torch in float16)'),
               # and rope_theta from rope_parameters, where transformers 5 writes it and EasyDeL does not look
               Load("exact", {"torch_load_mode": "streaming", easydel_causes.ROPE_THETA_FROM_FILE: True},
                    'torch_load_mode="streaming", config_kwargs={"rope_theta": <rope_parameters\' value>}')),
        architectures={"llama": _EASYDEL_DECODER, "qwen3": _EASYDEL_DECODER + _EASYDEL_QK_NORM},
        forward_causes=easydel_causes.forward_causes,
        needs=("easydel 0.3.0 pins jax ~= 0.9 (through ejkernel), flax == 0.12.3 and transformers ~= 5.5, and "
               "needs Pillow it does not declare: a venv of its own")),
    "maxtext": Target(
        name="maxtext", library="maxtext", version="0.2.5",
        cites=("guard/convert/maxtext/table.py, written from maxtext/checkpoint_conversion/utils/param_mapping.py "
               "(*_MAXTEXT_TO_HF_PARAM_MAPPING, *_PARAM_HOOK_FN); loaded by maxtext/utils/model_creation_utils.py: "
               "from_pretrained (load_parameters_path)"),
        environment=".venv-maxtext", make_target="make maxtext-venv",
        # options are MaxText flags; base.yml's defaults: weight_dtype float32 (a bf16 file widens exactly),
        # dtype bfloat16, scan_layers true (the conversion for --against is scanned, as MaxText's default)
        loads=(Load("defaults", {}, "weight_dtype=float32 (base.yml's default)"),
               Load("bfloat16 weights", {"weight_dtype": "bfloat16"}, "weight_dtype=bfloat16",
                    when_stored=("BF16",))),
        architectures={t: () for row in MAXTEXT_ROWS.values() for t in row.model_types},
        needs="MaxText 0.2.5 needs Python >= 3.12 and transformers >= 5.17: a venv of its own",
        converts_to="maxtext", exact_load="defaults", forward_causes=maxtext_causes.forward_causes,
        conventional_reference=maxtext_causes.conventional_reference),
}


def head_dim(config: dict[str, Any]) -> int:
    explicit = config.get("head_dim")
    if isinstance(explicit, int):
        return explicit
    return int(config["hidden_size"]) // int(config["num_attention_heads"])
