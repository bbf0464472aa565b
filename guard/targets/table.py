"""The targets: one literal row each, for ``convert --to`` and ``parity --against``.

A row holds its name and one line for the help; the environment its library runs in, by the name of a
row of ``guard.envs.registry`` (which holds the library's distribution and the version it was checked
with: written once, there); what it cites; its mapping as data, in the one step vocabulary of
``guard.convert.steps``; its writer for ``--to`` and its worker side and loads for ``--against``, named
by dotted strings and imported only when used.  The ``--to`` and ``--against`` choices, their help and
docs/jax.md's table are derived from these rows (``guard.targets.choices``, ``guard.targets.doc``).

Adding a target is adding a row here and a side in ``guard/worker/`` (tests/test_targets.py holds it so).
Plain data: this module imports nothing above ``guard.envs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from guard.envs.registry import ENVIRONMENTS, Environment
from guard.records import Record
from guard.targets.families import FAMILIES, Family
from guard.targets.mappings import (
    EASYDEL_DECODER,
    EASYDEL_QK_NORM,
    KERAS_DECODER,
    KERAS_QK_NORM,
    TUNIX_DECODER,
    TUNIX_QK_NORM,
    Mapped,
)
from guard.targets.maxtext import ARCHITECTURES as MAXTEXT_ARCHITECTURES, Architecture

# the writer of the Hugging Face layouts (flax_model.msgpack or Orbax for Flax, safetensors for PyTorch); a writer
# is "module:function" taking convert's flags (guard.cli.convert.ConvertOptions) and returning the exit code
HF_WRITER = "guard.cli.convert:write_hf_layout"
# EasyDeL's exact load: config.json's rope_parameters["rope_theta"] passed as config_kwargs (a worker option)
ROPE_THETA_FROM_FILE = "rope_theta_from_file"


class Load(Record):
    label: str  # "defaults" | "exact"
    options: Mapping[str, Any]  # passed to the library's loader by the worker
    says: str  # the option, as the library spells it, that a finding under the other load names
    when_stored: tuple[str, ...] = ()  # run only for a file stored in one of these dtypes (empty: always)


class Cause(Record):
    """What a stack's forward is known to do differently from transformers': its own setting, not the file's.
    A failing forward comparison it applies to names it ("every parameter bit-exact, the forward differs: ...").
    Every condition given must hold; ``says`` is formatted with the file's values of ``config_not``'s keys."""
    says: str  # the stack's setting, where it lives, and the option that avoids it (or that none does)
    # config.json's value of each key is known and another than this one (rope_theta: at the top level, else in
    # rope_parameters, where transformers 5 writes it)
    config_not: Mapping[str, float] = MappingProxyType({})
    rope_theta_nested: bool = False  # rope_theta only in rope_parameters (transformers 5's layout), not at the top
    dtypes: tuple[str, ...] = ()  # the comparisons computed in these dtypes (F32, BF16, F16); empty: every one
    tied: bool = False  # only where the input embedding is the output projection too
    model_types: tuple[str, ...] = ()  # only for these model_types (a prefix each); empty: every one
    avoided_by: str = ""  # a worker option: a load that sets it is not given this cause


class Target(Record):
    name: str
    help: str  # one line: what the target is, in the CLI's help and docs/jax.md
    cites: str  # the library's conversion code the mapping follows
    environment: str = ""  # a row of guard.envs.registry.ENVIRONMENTS ("": this process, no library of its own)
    reads: str = ""  # how the library reads a Hugging Face checkpoint (docs/jax.md)
    # model_type -> the HF tensors' names in the library and the steps between (a library that reads HF files)
    mapping: Mapping[str, tuple[Mapped, ...]] = MappingProxyType({})
    # a layout of its own: row name -> that architecture's parameter tree (MaxText); its model_types are mapped
    architectures: Mapping[str, Architecture] = MappingProxyType({})
    # transformers' twin classes: model_type -> what the PyTorch and Flax classes hold (the generic rules of
    # guard.convert.map.rules name each tensor from these rows)
    families: Mapping[str, Family] = MappingProxyType({})
    writer: str = ""  # --to: "module:function" writing this target, given convert's flags; returns the exit code
    # a layout of its own read back: "module:function" telling a SRC in it (a path -> bool), the --to it goes
    # back to, and the writer that does it (called for that --to instead of the --to row's writer)
    own_layout: str = ""
    back_to: str = ""
    back_writer: str = ""
    side: str = ""  # the worker side (a guard.worker.side.Side module) running the library
    loads: tuple[Load, ...] = ()  # --against: the loads the side is run with
    # ckpt-guard extras --against needs in the Python running ckpt-guard, beyond parity's (the Action installs them)
    extras: tuple[str, ...] = ()
    # the library reads no HF file: the checkpoint is converted first (``convert --to <converts_to>``, in a
    # temporary directory) and the mapping is that converter's ``architectures``
    converts_to: str = ""
    exact_load: str = "exact"  # the load whose options a finding under another load names
    # what the library's forward is known to do differently, as data: each one that applies (guard.against.causes)
    # is named on a failing forward finding
    causes: tuple[Cause, ...] = ()
    # "module:function": (file, config.json, input ids) -> transformers' fp32 outputs with the library's declared
    # forward conventions in them, or None where none apply: an fp32 miss this reference does not see is the
    # conventions only (a warning); one it sees too is something else (CG302)
    conventional_reference: str = ""

    @property
    def environment_row(self) -> Environment | None:
        return ENVIRONMENTS[self.environment] if self.environment else None

    @property
    def library(self) -> str:
        """The library's distribution (``google-tunix``); empty for a target of this process."""
        row = self.environment_row
        return row.distribution if row else ""

    @property
    def version(self) -> str:
        """The version the mapping was written from and the tests run: the environment's first checked one."""
        row = self.environment_row
        return row.checked[0] if row else ""

    @property
    def model_types(self) -> frozenset[str]:
        return (frozenset(self.mapping) | frozenset(self.families)
                | {t for row in self.architectures.values() for t in row.model_types})


TARGETS: dict[str, Target] = {
    "flax": Target(
        name="flax", help="transformers 4's Flax layout: flax_model.msgpack (or Orbax with --layout orbax)",
        cites=("guard/targets/families.py and guard/convert/map/rules.py, proven against transformers 4's Flax "
               "classes"),
        environment="tf4", reads="transformers 4's FlaxAutoModel classes (parity's Flax side)", families=FAMILIES,
        writer=HF_WRITER, side="guard.worker.flax_side"),
    "torch": Target(
        name="torch", help="safetensors for transformers' PyTorch classes (also the way back from MaxText)",
        cites=("guard/targets/families.py and guard/convert/map/rules.py, proven against transformers' PyTorch "
               "classes"),
        families=FAMILIES, writer=HF_WRITER),
    "tunix": Target(
        name="tunix", help="google-tunix's Flax NNX models",
        cites=("tunix/models/{llama3,qwen3}/params.py: _get_key_and_transform_mapping and "
               "create_model_from_safe_tensors; tunix/models/safetensors_loader.py: load_and_create_model"),
        environment="tunix",
        reads="at load: `tunix.models.<arch>.params.create_model_from_safe_tensors(dir, ModelConfig, mode=...)`",
        mapping={"llama": TUNIX_DECODER, "qwen3": TUNIX_DECODER + TUNIX_QK_NORM},
        side="guard.worker.tunix_side",
        loads=(Load("defaults", {"mode": "auto"}, 'mode="auto" (the optimized loader on Linux)'),
               Load("exact", {"mode": "original"}, 'mode="original"')),
        # measured on the tiny fp32 Qwen3 of tests/test_parity_against.py at rope_theta 1e4: max_rel 0.171 on the
        # logits, every parameter bit-exact
        causes=(Cause("tunix's Qwen3 and Llama 3 call RoPE without ModelConfig's rope_theta, so it runs at base 1e6 "
                      "whatever the model's (this one's: {rope_theta:g}): no option avoids it",
                      config_not={"rope_theta": 1e6}),)),
    "keras-hub": Target(
        name="keras-hub", help="keras-hub's backbones on the JAX backend",
        cites=("keras_hub/src/utils/transformers/convert_{llama3,qwen3}.py: convert_weights; "
               "keras_hub/src/utils/transformers/safetensor_utils.py: SafetensorLoader.port_weight"),
        environment="keras-hub",
        reads="at load: `Backbone.from_preset(dir)`, `convert_<arch>.py` + `SafetensorLoader.port_weight`",
        mapping={"llama": KERAS_DECODER, "qwen3": KERAS_DECODER + KERAS_QK_NORM},
        side="guard.worker.keras_hub_side",
        loads=(Load("defaults", {}, "no dtype (Keras' global policy)"),
               Load("exact", {"dtype": "float32"}, 'dtype="float32"'),
               # what keras-hub users run for a bf16 checkpoint: variables and compute in bf16
               Load("bfloat16 policy", {"dtype": "bfloat16"}, 'dtype="bfloat16"', when_stored=("BF16",))),
        # measured on the tiny fp32 models of tests/test_parity_against.py (every parameter bit-exact)
        causes=(Cause("keras-hub's Qwen3Decoder builds Qwen3Attention without layer_norm_epsilon, so its q/k norms "
                      "run at epsilon 1e-5 whatever rms_norm_eps (this model's: {rms_norm_eps:g}): no option avoids "
                      "it", config_not={"rms_norm_eps": 1e-5}, model_types=("qwen3",)),
                Cause("keras-hub's convert_llama3 (convert_backbone_config) leaves rms_norm_eps out, so its norms "
                      "run at epsilon 1e-6 whatever the model's (this one's: {rms_norm_eps:g}): no option avoids it",
                      config_not={"rms_norm_eps": 1e-6}, model_types=("llama",)))),
    "easydel": Target(
        name="easydel", help="EasyDeL's causal LMs",
        cites=("easydel/utils/parameters_transformation.py: StateDictConverter.process_tensor; "
               "easydel/infra/mixins/bridge.py: _from_torch_pretrained"),
        environment="easydel",
        reads="`AutoEasyDeLModelForCausalLM.from_pretrained(path, from_torch=True, torch_load_mode=...)`",
        mapping={"llama": EASYDEL_DECODER, "qwen3": EASYDEL_DECODER + EASYDEL_QK_NORM},
        side="guard.worker.easydel_side",
        loads=(Load("defaults", {}, 'torch_load_mode="full" (loads through torch in float16)'),
               # and rope_theta from rope_parameters, where transformers 5 writes it and EasyDeL does not look
               Load("exact", {"torch_load_mode": "streaming", ROPE_THETA_FROM_FILE: True},
                    'torch_load_mode="streaming", config_kwargs={"rope_theta": <rope_parameters\' value>}')),
        # measured on the tiny fp32 Qwen3 of tests/test_parity_against.py, every parameter bit-exact
        # (guard/against/easydel_causes.py)
        causes=(Cause("EasyDeL reads rope_theta only at config.json's top level (default 10000); this file keeps "
                      "rope_theta {rope_theta:g} in rope_parameters (transformers 5), so its RoPE runs at base "
                      '10000: config_kwargs={{"rope_theta": {rope_theta!r}}} avoids it',
                      config_not={"rope_theta": 10000.0}, rope_theta_nested=True, avoided_by=ROPE_THETA_FROM_FILE),
                # transformers rounds its table to the activations' dtype: in bf16 both round alike
                Cause("EasyDeL casts its RoPE cos/sin table to bfloat16 whatever the dtype "
                      "(easydel/infra/base_config.py: get_basic_frequencies), so every position past 0 rotates "
                      "with entries up to 4e-3 off: no option avoids it", dtypes=("F32", "F16")))),
    "maxtext": Target(
        name="maxtext", help="a MaxText Orbax checkpoint (its way back is --to torch)",
        cites=("guard/targets/maxtext.py, written from maxtext/checkpoint_conversion/utils/param_mapping.py "
               "(*_MAXTEXT_TO_HF_PARAM_MAPPING, *_PARAM_HOOK_FN); loaded by maxtext/utils/model_creation_utils.py: "
               "from_pretrained (load_parameters_path)"),
        environment="maxtext",
        reads="offline: `convert --to maxtext` into an Orbax checkpoint, then `load_parameters_path=OUT/0/items`",
        architectures=MAXTEXT_ARCHITECTURES,
        writer="guard.cli.convert_maxtext:write", side="guard.worker.maxtext_side",
        own_layout="guard.cli.convert_maxtext:is_maxtext_source", back_to="torch",
        back_writer="guard.cli.convert_maxtext:write",
        # options are MaxText flags; base.yml's defaults: weight_dtype float32 (a bf16 file widens exactly),
        # dtype bfloat16, scan_layers true (the conversion for --against is scanned, as MaxText's default)
        loads=(Load("defaults", {}, "weight_dtype=float32 (base.yml's default)"),
               Load("bfloat16 weights", {"weight_dtype": "bfloat16"}, "weight_dtype=bfloat16",
                    when_stored=("BF16",))),
        # the checkpoint is converted first, here, into Orbax's OCDBT (tensorstore writes it)
        extras=("orbax",), converts_to="maxtext", exact_load="defaults",
        # in bf16 transformers' logits carry the same rounding (guard/against/maxtext_causes.py)
        causes=(Cause("MaxText computes tied logits from the embedding table rounded to bfloat16 in every dtype "
                      "(layers/embeddings.py attend_on_embedding): no flag avoids it", dtypes=("F32",), tied=True),
                Cause("its gemma3 conversion stores the embedding times sqrt(hidden_size) rounded to bfloat16 "
                      "(param_mapping.py's embedding hook; the conversion's CG301), so its inputs and logits "
                      "scale by bf16(sqrt(hidden_size)) / sqrt(hidden_size)", dtypes=("F32",), tied=True,
                      model_types=("gemma3",))),
        conventional_reference="guard.against.maxtext_causes:conventional_reference"),
}
