"""Print guard/inventory/architectures_table.py: the weights transformers 5's model classes build, per model_type.

    .venv/bin/python scripts/architectures_table.py > /tmp/table.py   # transformers 5 and torch installed
    diff /tmp/table.py guard/inventory/architectures_table.py           # review, then copy it over

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

import re
import sys
import time
from collections.abc import Callable
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
    "type_vocab_size": 2, "relative_attention_num_buckets": 8, "num_kv_heads": 2,
}
# set for a valid sample, never a dimension the table keys on
NOT_SIZES = {"num_experts_per_tok", "n_group", "topk_group", "first_k_dense_replace"}
LAYER_CONTAINER = re.compile(r"^(.*?(?:^|\.)(?:layers|layer|h|block|blocks))\.(\d+)\.(.*)$")
EXPERT = re.compile(r"^(.*?(?:^|\.)experts)\.(\d+)\.(.*)$")


NESTED = ("text_config", "vision_config")  # sub-configs the sample sizes too; their fields are dotted


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
    for key, value in config.to_dict().items():
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
        elif key in NESTED and isinstance(value, dict):
            out.update((f"{key}.{k}", v) for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool))
    return out


def _shapes(class_name: str, config: Any) -> tuple[dict[str, tuple[int, ...]], set[str], Any]:
    import torch
    import transformers

    cls = getattr(transformers, class_name)
    with torch.device("meta"):
        model = cls(config)
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    params = {k for k, _ in model.named_parameters()} | {k for k, _ in model.named_buffers()}
    return state, set(state) - params, model  # state_dict names not among the unique ones: tied aliases


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


def _row(model_type: str, class_name: str) -> tuple[dict[str, Any], list[str]]:
    import transformers
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    notes: list[str] = []
    config = _config(model_type, {})
    state, tied, model = _shapes(class_name, config)
    values = _ints(config)
    sized = [k for k in config.sample_fields if k in values and k.rsplit(".", 1)[-1] not in NOT_SIZES]
    aliases = tied  # aliases whatever the config says (BERT's decoder bias, T5's embed_tokens)
    if "tie_word_embeddings" in config.to_dict():  # which names become aliases when the config ties them
        _, tied, _ = _shapes(class_name, _config(model_type, {}, tie=True))
        _, aliases, _ = _shapes(class_name, _config(model_type, {}, tie=False))
    base = _templated(state)
    # count fields: which field adds a layer to which container, and an expert
    counts: dict[str, str] = {}
    for field in (k for k in sized if "layer" in k.rsplit(".", 1)[-1] or "expert" in k.rsplit(".", 1)[-1]):
        try:
            more, _, _ = _shapes(class_name, _config(model_type, {field: values[field] + 1}))
        except Exception as exc:  # noqa: BLE001  a field the class cannot take one more of
            notes.append(f"{field}+1: {type(exc).__name__}")
            continue
        for (name, layer, expert) in _templated(more):
            if layer is not None and layer == values[field] and "{L}" in name:
                counts.setdefault(name.split(".{L}.")[0], field)
            if expert is not None and expert == values[field]:
                counts.setdefault("{E}", field)
    moved: dict[tuple[str, int | None, int | None], list[dict[str, list[tuple[int, int]]]]] = {}
    for field in sized:
        for factor in (2, 3):
            try:
                built, _, _ = _shapes(class_name, _config(model_type, {field: values[field] * factor}))
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
    for (name, layer, expert), shape in base.items():
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
    head_prefix = getattr(model, "base_model_prefix", "") or ""
    out_containers = {}
    for container, c in containers.items():
        kinds: dict[frozenset[Any], list[int]] = {}
        for layer, group in c["layers"].items():
            kinds.setdefault(group, []).append(layer)
        if len(kinds) == 1:
            selector, named = None, {"": next(iter(kinds))}
        elif len(kinds) == 2 and [0] in kinds.values():  # T5: the first layer alone holds the position bias
            selector = "first_layer"
            named = {("first" if layers == [0] else ""): group for group, layers in kinds.items()}
        elif "first_k_dense_replace" in values or "text_config.first_k_dense_replace" in values:
            k = values.get("first_k_dense_replace", values.get("text_config.first_k_dense_replace"))
            named = {("dense" if layers[0] < k else "moe"): group for group, layers in kinds.items()}
            selector = "first_k_dense_replace"
        else:
            notes.append(f"{container}: layers differ and no selector is known; first layer's kind kept")
            selector, named = None, {"": next(iter(kinds))}
        out_containers[container] = {"count": c["count"], "selector": selector,
                                     "kinds": {k: tuple(sorted(v)) for k, v in sorted(named.items())}}
    tie_field = "tie_word_embeddings"
    # transformers looks a class name up first, then the model_type (extract_weight_conversions_for_model)
    conversions = get_checkpoint_conversion_mapping(class_name) or get_checkpoint_conversion_mapping(model_type) or []
    renames: list[tuple[str, str]] = []
    experts: list[tuple[tuple[str, ...], str, int | None]] = []
    for transform in conversions + (get_checkpoint_conversion_mapping("legacy") or []):
        kind = type(transform).__name__
        sources, targets = list(transform.source_patterns), list(transform.target_patterns)
        if kind == "WeightRenaming" and len(targets) == 1:
            renames.extend((source, targets[0]) for source in sources)
        elif kind == "WeightConverter" and len(targets) == 1:
            ops = [type(op).__name__ for op in transform.operations]
            concat = next((op.dim for op in transform.operations if type(op).__name__ == "Concatenate"), None)
            if ops in (["MergeModulelist"], ["MergeModulelist", "Concatenate"]):
                experts.append((tuple(sources), targets[0], concat))
            else:
                notes.append(f"converter {sources} -> {targets} ({ops}) not copied")
        else:
            notes.append(f"{kind} {sources} -> {targets} not copied")
    cls = getattr(transformers, class_name)
    row = {
        "prefix": head_prefix,
        "base": type(getattr(model, head_prefix)).__name__ if head_prefix and hasattr(model, head_prefix) else "",
        "tied": tuple(sorted(tied - aliases)),
        "aliases": tuple(sorted(aliases)),
        "tie_default": bool(getattr(type(config)(), tie_field, False)),
        "flat": tuple(flat),
        "containers": out_containers,
        "expert_count": counts.get("{E}"),
        "renames": tuple(renames),
        "experts": tuple(experts),
        "ignore_unexpected": tuple(getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or ()),
        "ignore_missing": tuple(getattr(cls, "_keys_to_ignore_on_load_missing", None) or ()),
    }
    return row, notes


def main(argv: list[str]) -> int:
    import transformers

    started = time.perf_counter()
    print(f'TRANSFORMERS_VERSION = "{transformers.__version__}"')
    print("ARCHITECTURES: dict[str, dict[str, Row]] = {")
    for model_type, classes in CLASSES.items():
        print(f"    {model_type!r}: {{")
        for class_name in classes:
            row, notes = _row(model_type, class_name)
            print(f"        {class_name!r}: Row(")
            for key, value in row.items():
                _print_field(key, value)
            print("        ),")
            for note in notes:
                print(f"# {model_type} {class_name}: {note}", file=sys.stderr)
        print("    },")
    print("}")
    print(f"# generated in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _print_field(key: str, value: Any, indent: str = " " * 12) -> None:
    if key == "flat" or key == "tied" or not isinstance(value, (tuple, dict)) or not value:
        if key == "flat" and value:
            print(f"{indent}{key}=(")
            for entry in value:
                print(f"{indent}    {entry!r},")
            print(f"{indent}),")
        else:
            print(f"{indent}{key}={value!r},")
        return
    if key == "containers":
        print(f"{indent}{key}={{")
        for container, c in value.items():
            print(f"{indent}    {container!r}: Layers(count={c['count']!r}, selector={c['selector']!r}, kinds={{")
            for kind, group in c["kinds"].items():
                print(f"{indent}        {kind!r}: (")
                for entry in group:
                    print(f"{indent}            {entry!r},")
                print(f"{indent}        ),")
            print(f"{indent}    }}),")
        print(f"{indent}}},")
        return
    print(f"{indent}{key}={value!r},")


_: Callable[..., Any] = main
if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
