"""Write guard/inventory/architectures.bin: the weights transformers 5's model classes build, per model_type.

    .venv/bin/python scripts/architectures_table.py            # every model_type (transformers 5 and torch installed)
    .venv/bin/python scripts/architectures_table.py --types llama,bert --out /tmp/rows.bin   # some, elsewhere
    .venv/bin/python scripts/architectures_table.py --compare   # regenerate in memory, list the rows that changed

The classes: every class transformers' auto mappings name for a model_type (``MODEL_*_MAPPING_NAMES``: what a
config's ``architectures`` can name).  The types in ``CLASSES`` are built from small sample configs (``SAMPLE``);
every other type from its own default config and sub-configs, its layer counts shrunk to two.  A class that
cannot be built is left out with its reason (the data's index keeps the list and the coverage figure).

Each class in ``CLASSES`` is built on the meta device (no weights, no memory) from a small sample config,
and its ``state_dict()`` names and shapes are read.  Which config field a dimension follows is found by
building it again with that field doubled (and tripled, to tell ``2*x`` from ``x + 64``): a dimension is
written as the product (and quotient) of the fields that move it, times a constant, and kept only when
that expression reproduces the dimension in every build; otherwise it is ``None`` (not checked).

Layer indices become ``{L}`` (the container's count field found by building one more layer); layers
whose weights differ (DeepSeek's dense first layers) become kinds, chosen at load time as the config
chooses them.  The file-name renames transformers applies at load (its ``conversion_mapping``:
``WeightRenaming`` and the per-expert ``WeightConverter``s) are copied as regular expressions.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

# model_type -> the classes whose weights the table lists (the first is the default when no
# architectures field names one); a class whose config nests the text model is built from it.
CLASSES: dict[str, tuple[str, ...]] = {
    "llama": ("LlamaForCausalLM",),
    "mistral": ("MistralForCausalLM",),
    "mixtral": ("MixtralForCausalLM",),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
    "qwen2_moe": ("Qwen2MoeForCausalLM",),
    "qwen3_moe": ("Qwen3MoeForCausalLM",),
    "gemma": ("GemmaForCausalLM",),
    "gemma2": ("Gemma2ForCausalLM",),
    "gemma3_text": ("Gemma3ForCausalLM",),
    "gemma3": ("Gemma3ForConditionalGeneration",),
    "phi3": ("Phi3ForCausalLM",),
    "gpt2": ("GPT2LMHeadModel",),
    "gpt_neox": ("GPTNeoXForCausalLM",),
    "falcon": ("FalconForCausalLM",),
    "deepseek_v2": ("DeepseekV2ForCausalLM",),
    "deepseek_v3": ("DeepseekV3ForCausalLM",),
    "gpt_oss": ("GptOssForCausalLM",),
    "qwen2_vl_text": ("Qwen2VLTextModel",),
    "bert": ("BertForMaskedLM", "BertForPreTraining"),
    "t5": ("T5ForConditionalGeneration",),
}

# Sample values for the size fields a config has (doubling one keeps every divisibility the classes assert).
SAMPLE: dict[str, int] = {
    "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 48, "shared_expert_intermediate_size": 80,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
    "num_hidden_layers": 3, "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "kv_lora_rank": 32, "q_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "max_position_embeddings": 40, "d_model": 64, "d_ff": 96, "d_kv": 16, "num_heads": 4, "num_layers": 3,
    "num_decoder_layers": 3, "n_embd": 64, "n_head": 4, "n_layer": 3, "n_positions": 40, "n_inner": 96,
    "type_vocab_size": 2, "relative_attention_num_buckets": 8, "num_kv_heads": 2, "ffn_hidden_size": 160,
}
# set for a valid sample, never a dimension the table keys on
NOT_SIZES = {"num_experts_per_tok", "n_group", "topk_group", "first_k_dense_replace"}
LAYER_CONTAINER = re.compile(r"^(.*?(?:^|\.)(?:layers|layer|h|block|blocks))\.(\d+)\.(.*)$")
EXPERT = re.compile(r"^(.*?(?:^|\.)experts)\.(\d+)\.(.*)$")


NESTED = ("text_config", "vision_config")  # sub-configs the sample sizes too; their fields are dotted
# a layer count: shrunk to two in a default config (the build's time is its modules')
LAYER_COUNT = re.compile(r"^(?:num_(?:hidden_|encoder_|decoder_|text_|vision_|audio_)?layers|n_layers?|num_layers|"
                         r"encoder_layers|decoder_layers|depth|num_hidden_blocks)$")
NOT_SIZE = re.compile(r"(?:_token_id|_token_index|_id|_idx|seed|sliding_window|max_window_layers|num_labels|"
                      r"_steps|_layer|_layers_to_freeze|feature_layer|select_layer|chunk_size)s?$")
# config fields that never change which modules exist (never a flag)
HARMLESS = {
    "tie_word_embeddings", "use_cache", "return_dict", "output_hidden_states", "output_attentions", "torchscript",
    "use_return_dict", "is_decoder", "tie_encoder_decoder", "pruned_heads", "is_encoder_decoder", "dtype",
    "torch_dtype", "rope_scaling", "rope_parameters", "rope_theta", "sliding_window", "use_sliding_window",
    "max_window_layers", "problem_type", "finetuning_task", "tokenizer_class", "prefix", "task_specific_params",
    "id2label", "label2id", "architectures", "transformers_version", "_name_or_path", "output_router_logits",
    "norm_topk_prob", "use_bfloat16", "tf_legacy_loss", "gradient_checkpointing", "quantization_config",
    "pretraining_tp", "attn_implementation", "_attn_implementation_autoset", "chunk_size_feed_forward",
    "add_pooling_layer", "cross_attention_hidden_size", "head_dim", "layer_norm_eps", "rms_norm_eps",
    "initializer_range", "hidden_act", "model_type", "base_config_key", "sub_configs", "output_scores",
    "bad_words_ids", "begin_suppress_tokens", "suppress_tokens", "forced_decoder_ids", "max_length",
    "use_flash_attention_2", "_commit_hash", "routed_scaling_factor", "topk_method", "scoring_func",
    "num_experts_per_tok", "n_group", "topk_group", "ep_size", "aux_loss_alpha", "seq_aux", "moe_topk",
    "router_jitter_noise", "use_qk_norm_in_router",
}
EXPLICIT_FLAGS = ("position_embedding_type", "feed_forward_proj", "decoder_sparse_step", "moe_layer_freq",
                  "interleave_moe_layer_step",
                  "num_dense_layers", "first_k_dense_replace")
NULLABLE = re.compile(r"rank|lora|inner|ffn|intermediate|kv_heads|experts")  # an int field that may be null
ANY_INT = "<int>"  # a flag's value: any number agrees, null does not (guard.inventory.architectures)


def _sample(cls: Any, overrides: dict[str, int], prefix: str = "") -> dict[str, Any]:
    known = cls().to_dict()
    values: dict[str, Any] = {k: v for k, v in SAMPLE.items() if k in known}
    if cls.__name__ in ("GPT2Config", "BertConfig", "T5Config", "GPTNeoXConfig", "FalconConfig", "Phi3Config"):
        values.pop("head_dim", None)  # derived from the hidden size and heads there
    for token in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        if known.get(token) is not None:
            values[token] = 0  # inside the sample's small vocabulary
    values.update({k[len(prefix):]: v for k, v in overrides.items() if k.startswith(prefix) and "." not in
                   k[len(prefix):]})
    if "n_routed_experts" in values:
        values["topk_method"] = "greedy"
    return values


def _sub_keys(data: dict[str, Any]) -> list[str]:
    return [k for k, v in data.items() if isinstance(v, dict) and (k.endswith("_config") or k in ("encoder", "decoder"))
            and "model_type" in v]


class Plan:
    """How a model_type's configs are made: from the sample (``CLASSES``) or its own default, shrunk."""

    def __init__(self, model_type: str) -> None:
        from transformers import CONFIG_MAPPING

        self.model_type = model_type
        self.cls = CONFIG_MAPPING[model_type]
        self.sample = model_type in CLASSES
        self.flags: dict[str, Any] | None = None
        if not self.sample:
            self.default = self.cls().to_dict()
            self.shrunk: dict[str, int] = {}
            for prefix, data in [("", self.default)] + [(f"{k}.", self.default[k]) for k in _sub_keys(self.default)]:
                for key, value in data.items():
                    if LAYER_COUNT.match(key) and isinstance(value, int) and not isinstance(value, bool) and value > 2:
                        self.shrunk[prefix + key] = 2

    def config(self, overrides: dict[str, Any], *, tie: bool | None = None, shrink: bool = True) -> Any:
        if self.sample:
            return _config(self.model_type, overrides, tie=tie)
        data = json.loads(json.dumps(self.default))
        for key, value in {**(self.shrunk if shrink else {}), **overrides}.items():
            head, _, rest = key.rpartition(".")
            where = data[head] if head else data
            old = where.get(rest)
            where[rest] = value
            if LAYER_COUNT.match(rest) and isinstance(old, int):
                for k, v in list(where.items()):  # per-layer lists (layer_types): as long as the count
                    if isinstance(v, list) and len(v) == old and old and all(isinstance(x, str) for x in v):
                        where[k] = [v[i % len(v)] for i in range(value)]
        if tie is not None:
            data["tie_word_embeddings"] = tie
        data.pop("transformers_version", None)
        config = self.cls.from_dict(data)
        config.sample_fields = tuple(self.sized(data))
        return config

    def sized(self, data: dict[str, Any]) -> list[str]:
        out = []
        for prefix, sub in [("", data)] + [(f"{k}.", data[k]) for k in _sub_keys(data)]:
            for key, value in sub.items():
                if (isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 20
                        and not NOT_SIZE.search(key) and key not in HARMLESS):
                    out.append(prefix + key)
        return out


def _config(model_type: str, overrides: dict[str, int], *, tie: bool | None = None) -> Any:
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    values = _sample(cls, overrides)
    fields = [k for k in values if k in SAMPLE]
    default = cls()
    for sub in NESTED:
        sub_cls = type(getattr(default, sub)) if getattr(default, sub, None) is not None else None
        if sub_cls is not None:
            nested = _sample(sub_cls, overrides, f"{sub}.")
            values[sub] = nested
            fields += [f"{sub}.{k}" for k in nested if k in SAMPLE]
    config = cls(**values, **({"tie_word_embeddings": tie} if tie is not None else {}))
    config.sample_fields = tuple(fields)
    return config


def _ints(config: Any) -> dict[str, int]:
    """config's int fields, a sub-config's as ``text_config.hidden_size``."""
    out = {}
    data = config.to_dict()
    for key, value in data.items():
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    for key in _sub_keys(data):
        out.update((f"{key}.{k}", v) for k, v in data[key].items() if isinstance(v, int) and not isinstance(v, bool))
    return out


def _shapes(class_name: str, config: Any) -> tuple[dict[str, tuple[int, ...]], set[str], Any]:
    import torch
    import transformers

    cls = getattr(transformers, class_name)
    with torch.device("meta"):
        model = cls(config)
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    params = {k for k, _ in model.named_parameters()} | {k for k, _ in model.named_buffers()}
    from guard.inventory.build_rows import tied_names

    aliases = (set(state) - params) | (tied_names(model) & set(state))
    return state, aliases, model  # state_dict names not among the unique ones, and the tied: aliases


def _templated(names: dict[str, tuple[int, ...]]) -> dict[tuple[str, int | None, int | None], tuple[int, ...]]:
    out = {}
    for name, shape in names.items():
        layer: int | None = None
        expert: int | None = None
        m = LAYER_CONTAINER.match(name)
        if m:
            layer = int(m.group(2))
            name = f"{m.group(1)}.{{L}}.{m.group(3)}"
        m = EXPERT.match(name)
        if m:
            expert = int(m.group(2))
            name = f"{m.group(1)}.{{E}}.{m.group(3)}"
        out[(name, layer, expert)] = shape
    return out


def _fit(values: dict[str, int], base: int, moved: dict[str, list[tuple[int, int]]]) -> str | int | None:
    """An expression over ``values``' fields giving ``base`` and every moved build's dimension, or None."""
    up, down = [], []
    for field, seen in moved.items():
        ratios = {dim / base if base else None for factor, dim in seen if factor == 2}
        if ratios == {2.0}:
            up.append(field)
        elif ratios == {0.5}:
            down.append(field)
        else:
            return None
    if not up and not down:  # a constant: a field the sample does not set may move it, so left unchecked
        return base if base == 1 else None
    num = 1
    for f in up:
        num *= values[f]
    den = 1
    for f in down:
        den *= values[f]
    constant = base * den / num
    if constant != int(constant) or constant <= 0:
        return None
    constant = int(constant)
    expression = "*".join(([str(constant)] if constant != 1 else []) + up)
    if down:
        expression += "//" + ("(" + "*".join(down) + ")" if len(down) > 1 else down[0])
    for field, seen in moved.items():  # check: every build's dimension is what the expression says
        for factor, dim in seen:
            if _evaluate(expression, {**values, field: values[field] * factor}) != dim:
                return None
    return expression


def _evaluate(expression: str, values: dict[str, int]) -> int:
    names = {k.replace(".", "__"): v for k, v in values.items()}  # a sub-config's field as one identifier
    return int(eval(expression.replace(".", "__"), {"__builtins__": {}}, names))  # the fitter's own strings only


def _flags(plan: Plan, class_name: str, state: dict[str, tuple[int, ...]], notes: list[str]) -> dict[str, Any]:
    """The config fields that change which modules the class builds, with their default: each bool field is
    flipped and the class built again (a field whose flip changes nothing is left out); a field whose default is
    None (Falcon's ffn_hidden_size, DeepSeek's q_lora_rank), per-layer lists and a few named strings are kept."""
    from transformers import CONFIG_MAPPING

    if plan.flags is not None:  # measured on the type's first class: the config's, not a head's
        return plan.flags
    default = CONFIG_MAPPING[plan.model_type]().to_dict()
    flags: dict[str, Any] = {}
    plan.flags = flags
    for prefix, data in [("", default)] + [(f"{k}.", default[k]) for k in _sub_keys(default)]:
        for key, value in data.items():
            name = prefix + key
            if key in HARMLESS or key.startswith("_") or "dropout" in key:
                continue
            if isinstance(value, list) and key == "layer_types":
                continue  # layers whose kinds build other modules are the row's kinds (the layer_types selector)
            elif isinstance(value, list) and key.endswith("layers") and all(isinstance(v, int) for v in value):
                flags[name] = value  # mlp_only_layers: which layers differ
            elif key in EXPLICIT_FLAGS:
                flags[name] = value
            elif NOT_SIZE.search(key):
                continue
            elif isinstance(value, bool):
                try:
                    flipped, _, _ = _shapes(class_name, plan.config({name: not value}))
                except Exception:  # noqa: BLE001  the class refuses the other value: a file with it is not judged
                    flags[name] = value
                    continue
                if flipped != state:
                    flags[name] = value
            elif value is None:
                flags[name] = value
            elif isinstance(value, int) and NULLABLE.search(key):
                try:  # DeepSeek-V2-Lite's q_lora_rank: null builds other modules
                    nulled, _, _ = _shapes(class_name, plan.config({name: None}))
                except Exception:  # noqa: BLE001  the class needs a number there
                    continue
                if set(nulled) != set(state):
                    flags[name] = ANY_INT
    return flags


def _tie_key(plan: Plan, class_name: str, notes: list[str]) -> tuple[str, bool, set[str], set[str]]:
    """Where the class reads its tie (the top level, or a nested text config), its default, and the names tied
    when it ties and aliased when it does not."""
    from transformers import CONFIG_MAPPING

    default = CONFIG_MAPPING[plan.model_type]().to_dict()
    candidates = ["tie_word_embeddings"] + [f"{k}.tie_word_embeddings" for k in _sub_keys(default)
                                            if "tie_word_embeddings" in default[k]]
    base_tied: set[str] = set()
    for key in candidates:
        try:
            _, on, _ = _shapes(class_name, plan.config({key: True}))
            _, off, _ = _shapes(class_name, plan.config({key: False}))
        except Exception as exc:  # noqa: BLE001
            notes.append(f"tie {key}: {type(exc).__name__}")
            continue
        if on != off:
            head, _, rest = key.rpartition(".")
            value = (default[head] if head else default).get(rest)
            return key, bool(value), on - off, off
        base_tied = on
    return "tie_word_embeddings", bool(default.get("tie_word_embeddings", False)), set(), base_tied


def _guess(values: dict[str, int], sized: list[str], dim: int) -> str | int | None:
    """A head's dimension the type's first class did not build: unchecked.  Matching it to the one sized field of
    that value was a coincidence as often as not (a token classifier's 2 labels read as type_vocab_size: every
    fine-tuned one of 9 labels a false CG125; wav2vec2's 512 read as xvector_output_dim), and a head's own sizes
    (num_labels, a projection) are not a config's size fields; building it again to check costs a build per head."""
    return None


def _row(model_type: str, class_name: str, plan: Plan | None = None,
         known: dict[str, tuple[Any, ...]] | None = None) -> tuple[dict[str, Any], list[str]]:
    """One class's row.  ``known``: the expressions the type's first class was fitted to, by name (a default
    config's type: the other classes are built once, their names looked up there, a head's own dimension
    matched to the one field of its value)."""

    from guard.inventory.build_rows import conversions, ignore_keys, sub_models

    plan = plan or Plan(model_type)
    notes: list[str] = []
    config = plan.config({})
    state, aliases, model = _shapes(class_name, config)
    values = _ints(config)
    sized = [k for k in config.sample_fields if k in values and k.rsplit(".", 1)[-1] not in NOT_SIZES]
    tie_key, tie_default, tied, aliases_off = _tie_key(plan, class_name, notes)
    if tied:
        aliases = aliases_off
    else:
        tied = set()
    base = _templated(state)
    # count fields: which field adds a layer to which container, and an expert
    counts: dict[str, str] = {}
    count_fields = [k for k in (config.sample_fields if plan.sample else list(plan.shrunk) + sized)
                    if k in values and ("layer" in k.rsplit(".", 1)[-1] or "expert" in k.rsplit(".", 1)[-1]
                                        or LAYER_COUNT.match(k.rsplit(".", 1)[-1]))]
    for field in dict.fromkeys(count_fields):
        try:
            more, _, _ = _shapes(class_name, plan.config({field: values[field] + 1}))
        except Exception as exc:  # noqa: BLE001  a field the class cannot take one more of
            notes.append(f"{field}+1: {type(exc).__name__}")
            continue
        for (name, layer, expert) in _templated(more):
            if layer is not None and layer == values[field] and "{L}" in name:
                counts.setdefault(name.split(".{L}.")[0], field)
            if expert is not None and expert == values[field]:
                counts.setdefault("{E}", field)
    moved: dict[tuple[str, int | None, int | None], list[dict[str, list[tuple[int, int]]]]] = {}
    for field in sized if known is None else ():
        if not plan.sample and LAYER_COUNT.match(field.rsplit(".", 1)[-1]):
            continue
        for factor in (2, 3):
            if factor == 3 and not any(field in d for dims in moved.values() for d in dims):
                break  # moved nothing when doubled: tripling would not either
            try:
                built, _, _ = _shapes(class_name, plan.config({field: values[field] * factor}))
            except Exception as exc:  # noqa: BLE001
                notes.append(f"{field}*{factor}: {type(exc).__name__}")
                continue
            for key, shape in _templated(built).items():
                if key not in base or len(shape) != len(base[key]):
                    continue
                dims = moved.setdefault(key, [{} for _ in shape])
                for i, (was, now) in enumerate(zip(base[key], shape)):
                    if was != now or factor == 3 and field in dims[i]:
                        dims[i].setdefault(field, []).append((factor, now))
    entries: dict[tuple[str, int | None], tuple[Any, ...]] = {}
    head_prefix = getattr(model, "base_model_prefix", "") or ""
    for (name, layer, expert), shape in base.items():
        if known is not None:
            stripped = name[len(head_prefix) + 1:] if head_prefix and name.startswith(head_prefix + ".") else None
            expressions = known.get(name) or (known.get(stripped) if stripped else None) or known.get(
                f"{head_prefix}.{name}")
            if expressions is None or len(expressions) != len(shape) or any(
                    e is not None and _evaluate(str(e), values) != d for e, d in zip(expressions, shape)):
                expressions = tuple(_guess(values, sized, d) for d in shape)
            entries[(name, layer)] = tuple(expressions)
            continue
        dims = moved.get((name, layer, expert), [{} for _ in shape])
        entries[(name, layer)] = tuple(_fit(values, d, {f: s for f, s in m.items()}) for d, m in zip(shape, dims))
    # layers -> kinds (sets of entries), and how the config picks a layer's kind
    per_layer: dict[tuple[str, int], set[tuple[str, tuple[Any, ...]]]] = {}
    flat: list[tuple[str, tuple[Any, ...]]] = []
    for (name, layer), shape in sorted(entries.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if layer is None:
            flat.append((name, shape))
        else:
            per_layer.setdefault((name.split(".{L}.")[0], layer), set()).add((name, shape))
    containers: dict[str, dict[str, Any]] = {}
    for (container, layer), group in sorted(per_layer.items()):
        c = containers.setdefault(container, {"count": counts.get(container), "layers": {}})
        c["layers"][layer] = frozenset(group)
    layer_types = getattr(config, "layer_types", None) or getattr(getattr(config, "text_config", None),
                                                                  "layer_types", None)
    out_containers = {}
    for container, c in containers.items():
        kinds: dict[frozenset[Any], list[int]] = {}
        for layer, group in c["layers"].items():
            kinds.setdefault(group, []).append(layer)
        if len(kinds) == 1:
            selector, named = None, {"": next(iter(kinds))}
        elif len(kinds) == 2 and ("first_k_dense_replace" in values or "text_config.first_k_dense_replace" in values):
            k = values.get("first_k_dense_replace", values.get("text_config.first_k_dense_replace"))
            named = {("dense" if layers[0] < k else "moe"): group for group, layers in kinds.items()}
            selector = "first_k_dense_replace"
        elif len(kinds) == 2 and [0] in kinds.values():  # T5: the first layer alone holds the position bias
            selector = "first_layer"
            named = {("first" if layers == [0] else ""): group for group, layers in kinds.items()}
        elif (isinstance(layer_types, list) and len(layer_types) == len(c["layers"])
              and all(len({layer_types[i] for i in layers}) == 1 for layers in kinds.values())
              and len({layer_types[layers[0]] for layers in kinds.values()}) == len(kinds)):
            selector = "layer_types"  # hybrids: a layer's kind is its layer_types entry
            named = {str(layer_types[layers[0]]): group for group, layers in kinds.items()}
        else:
            raise LookupError(f"{container}: layers differ and no selector is known")
        out_containers[container] = {"count": c["count"], "selector": selector,
                                     "kinds": {k: tuple(sorted(v)) for k, v in sorted(named.items())}}
    missing_counts = [c for c, v in out_containers.items() if v["count"] is None]
    if missing_counts:
        raise LookupError(f"no config field counts the layers of {', '.join(missing_counts)}")
    renames, experts, more_notes = conversions(model)
    notes += more_notes
    ignore_missing, ignore_unexpected = ignore_keys(model)
    buffers = {}
    for name, buffer in model.named_buffers():
        if name not in state:  # non-persistent: transformers loads it where the file holds it
            templated, _ = next(iter(_templated({name: ()})))[:2]
            buffers[templated] = tuple(None for _ in buffer.shape)
    row = {
        "prefix": head_prefix,
        "base": type(getattr(model, head_prefix)).__name__ if head_prefix and hasattr(model, head_prefix) else "",
        "tied": sorted(tied - aliases),
        "aliases": sorted(aliases),
        "tie_default": tie_default,
        "flat": flat,
        "containers": out_containers,
        "expert_count": counts.get("{E}"),
        "renames": renames,
        "experts": experts,
        "ignore_unexpected": ignore_unexpected,
        "ignore_missing": ignore_missing,
        "buffers": sorted(buffers.items()),
        "flags": {k: v for k, v in _flags(plan, class_name, state, notes).items()  # the selector follows it
                  if not (k.endswith("first_k_dense_replace")
                          and any(c["selector"] == "first_k_dense_replace" for c in out_containers.values()))},
        "sub_models": sub_models(model),
        "tie_key": tie_key,
        "source": "table",
    }
    return row, notes


def classes_by_type(types: list[str] | None = None) -> dict[str, list[str]]:
    """model_type -> every class the auto mappings name for it (the causal LM or conditional generation head
    first: the class ``architectures`` most often names); ``CLASSES``' types keep their order first."""
    import transformers
    from transformers.models.auto import modeling_auto

    found: dict[str, list[str]] = {}
    for name in sorted(n for n in dir(modeling_auto) if n.startswith("MODEL_") and n.endswith("_MAPPING_NAMES")):
        for model_type, value in getattr(modeling_auto, name).items():
            if types is not None and model_type not in types:
                continue  # (looking a class up imports its module: a few types need only theirs)
            for class_name in (value if isinstance(value, (list, tuple)) else [value]):
                if hasattr(transformers, class_name) and class_name not in found.setdefault(model_type, []):
                    found[model_type].append(class_name)
    for model_type, classes in CLASSES.items():
        if types is not None and model_type not in types:
            continue
        found[model_type] = list(classes) + [c for c in found.get(model_type, []) if c not in classes]
    return found


def _type_rows(item: tuple[str, list[str]]) -> tuple[str, dict[str, Any], dict[str, str], list[str], float]:
    """One model_type's rows, the classes left out with their reasons, notes, seconds (in a worker)."""
    import signal
    import warnings

    warnings.filterwarnings("ignore")
    model_type, classes = item
    started = time.perf_counter()
    rows: dict[str, Any] = {}
    left: dict[str, str] = {}
    notes: list[str] = []

    def _late(signum: int, frame: Any) -> None:
        raise TimeoutError("over the per-class time limit")

    signal.signal(signal.SIGALRM, _late)
    try:
        plan = Plan(model_type)
    except Exception as exc:  # noqa: BLE001
        return model_type, {}, {c: f"its config: {_why(exc)}" for c in classes}, [], time.perf_counter() - started
    known: dict[str, tuple[Any, ...]] | None = None
    # a default config's type: the base model fitted first (its names are every head's), the heads looked up in it
    order = sorted(classes, key=lambda c: not c.endswith("Model")) if not plan.sample else classes
    for class_name in order:
        signal.alarm(PER_CLASS_S)
        try:
            try:
                rows[class_name], class_notes = _row(model_type, class_name, plan, known)
            except Exception:
                if plan.sample or not plan.shrunk:
                    raise
                # the layer counts shrunk break the config's per-layer fields (lists, stage names): at full depth
                signal.alarm(PER_CLASS_S)
                whole = Plan(model_type)
                whole.shrunk = {}
                rows[class_name], class_notes = _row(model_type, class_name, whole, known)
            notes += [f"{model_type} {class_name}: {n}" for n in class_notes]
            if known is None and not plan.sample:
                row = rows[class_name]
                known = {name: tuple(shape) for name, shape in row["flat"]}
                for layers in row["containers"].values():
                    for group in layers["kinds"].values():
                        known.update((name, tuple(shape)) for name, shape in group)
        except Exception as exc:  # noqa: BLE001  left out, with its reason
            left[class_name] = _why(exc)
        finally:
            signal.alarm(0)
    rows = {c: rows[c] for c in classes if c in rows}  # the mappings' order: the usual head first
    return model_type, rows, left, notes, time.perf_counter() - started


PER_CLASS_S = 240


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:160]}"


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(row))


def generate(types: list[str] | None, workers: int, log: Any = None, partial: str | None = None
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rows of ``types`` (all by default): (model_type -> class -> row, figures).  ``partial``: a file each
    finished type is appended to, and read back by the next run (``--resume``)."""
    import transformers

    started = time.perf_counter()
    wanted = classes_by_type(types)
    items = [(t, wanted[t]) for t in (types or sorted(wanted)) if t in wanted]
    rows: dict[str, Any] = {}
    left: dict[str, str] = {}
    done: dict[str, Any] = {}
    if partial and os.path.exists(partial):  # a run cut short: its finished types kept
        with open(partial) as f:
            for line in f:
                record = json.loads(line)
                done[record["type"]] = record
    todo = [item for item in items if item[0] not in done]
    for record in done.values():
        if record["rows"]:
            rows[record["type"]] = record["rows"]
        left.update({f"{record['type']}/{c}": why for c, why in record["left"].items()})
    keep = open(partial, "a") if partial else None  # noqa: SIM115  closed below
    if workers > 1:
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(workers, maxtasksperchild=8)
        results = pool.imap_unordered(_type_rows, todo)
    else:
        pool = None
        results = map(_type_rows, todo)
    for model_type, type_rows, type_left, notes, seconds in results:
        if type_rows:
            rows[model_type] = {c: _jsonable(r) for c, r in type_rows.items()}
        left.update({f"{model_type}/{c}": why for c, why in type_left.items()})
        if keep is not None:
            keep.write(json.dumps({"type": model_type, "rows": rows.get(model_type, {}), "left": type_left}) + "\n")
            keep.flush()
        if log is not None:
            print(f"{model_type}: {len(type_rows)} rows, {len(type_left)} left out, {seconds:.1f} s", file=log,
                  flush=True)
            for note in notes:
                print(f"  # {note}", file=log)
    if pool is not None:
        pool.close()
        pool.join()
    if keep is not None:
        keep.close()
    total = sum(len(c) for _, c in items)
    from transformers import CONFIG_MAPPING

    figures = {"known_types": sorted(CONFIG_MAPPING.keys()),
               "classes": total, "rows": sum(len(r) for r in rows.values()), "model_types": len(items),
               "types_with_rows": len(rows), "left_out": dict(sorted(left.items())),
               "seconds": round(time.perf_counter() - started, 1), "transformers": transformers.__version__}
    return rows, figures


def compare(fresh: dict[str, Any], types: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(rows that changed, classes that are new) between ``fresh`` and the package data."""
    from guard.inventory.rows import row_from_json, rows_for

    changed, new = [], []
    for model_type, classes in sorted(fresh.items()):
        if types and model_type not in types:
            continue
        stored = rows_for(model_type) or {}
        for class_name, data in classes.items():
            row = row_from_json(data)
            if class_name not in stored:
                new.append(f"{model_type}/{class_name}")
            elif stored[class_name] != row:
                changed.append(f"{model_type}/{class_name}")
    return changed, new


def main(argv: list[str]) -> int:
    import argparse

    from guard.inventory.rows import DATA, write

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", help="comma-separated model_types (default: every one)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "guard" / "inventory" / DATA))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--compare", action="store_true", help="write nothing: list the rows that differ")
    parser.add_argument("--log", default=None, help="per-type progress and notes (default: stderr)")
    parser.add_argument("--partial", default=None, help="keep each finished type here; a rerun resumes from it")
    args = parser.parse_args(argv)
    types = [t for t in args.types.split(",") if t] if args.types else None
    log = open(args.log, "w") if args.log else sys.stderr  # noqa: SIM115  closed at exit
    rows, figures = generate(types, args.workers, log, args.partial)
    if args.compare:
        changed, new = compare(rows, types)
        for name in new:
            print(f"new: {name}")
        for name in changed:
            print(f"changed: {name}")
        return 1 if changed else 0
    import transformers

    size = write(args.out, transformers.__version__, rows, figures, sampled=tuple(t for t in CLASSES if t in rows))
    print(f"{figures['rows']} of {figures['classes']} classes over {figures['types_with_rows']} of "
          f"{figures['model_types']} model_types in {figures['seconds']} s; {size:,} bytes -> {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
