"""MaxText's mapping as data: one row per architecture (the target's row is ``guard.targets.table``'s).

Every row's parameters are written from MaxText's own conversion code, at the version its
environment names (``guard.envs.registry``): ``maxtext/checkpoint_conversion/utils/param_mapping.py``,
the ``*_PARAM_MAPPING`` and ``*_PARAM_HOOK_FN`` functions named in ``cite``, and the modules that
decide what the forward expects (``layers/attentions.py`` ``init_query_w``: the query kernel carries
1/sqrt(head_dim) unless the model has qk-norm or a ``query_pre_attn_scalar``;
``layers/embeddings.py``: ``LLaMARotaryEmbedding``, interleaved pairs, only for
``llama3.1`` model names, ``RotaryEmbedding``, HF's halves, otherwise).

A parameter's MaxText path starts with ``layers/`` when there is one per decoder layer
(``decoder/layers_{i}/...`` unscanned, ``decoder/layers/...`` stacked on ``param_scan_axis``
when scanned); its HF name holds ``{i}`` for the layer and ``{e}`` for an expert (stacked on
axis 0, MaxText's expert axis).  ``shape`` names the HF tensor's dimensions by the symbols
``source_config.dimensions`` reads from config.json.
"""

from __future__ import annotations

from guard.records import Record

PARAM_SCAN_AXIS = 1  # MaxText's base.yml default; scanned layers stack here (experts lead: axes 0 and 1)


class Param(Record):
    maxtext: str  # "/"-joined path under params/params; "layers/..." is per decoder layer
    hf: str  # the HF tensor name; {i} the layer, {e} the expert
    shape: tuple[str, ...]  # the HF tensor's dimensions, by symbol
    steps: tuple[str, ...] = ()  # guard.convert.steps names, applied in order going to MaxText
    optional: bool = False  # present in some checkpoints of the architecture only (biases)
    layer: tuple[int, int] = (1, 0)  # (stride, offset): MaxText layer i holds HF layer stride * i + offset
    # scanned only: MaxText stacks blocks of this many layers (decoder/layers/layers_{k}, block j = HF layer
    # block * j + k) and keeps the leftover layers unstacked (decoder/layers_remainder/layers_{r}); 0: no blocks
    block: int = 0


class Architecture(Record):
    name: str
    model_types: tuple[str, ...]
    model_name: str  # the MaxText model_name whose decoder_block and activations this row matches
    params: tuple[Param, ...]
    cite: str
    moe: bool = False

    def required(self, *, tied: bool) -> tuple[Param, ...]:
        return tuple(p for p in self.params if not (tied and p.maxtext == LOGITS.maxtext))


EMBED = Param("token_embedder/embedding", "model.embed_tokens.weight", ("V", "D"))
FINAL_NORM = Param("decoder/decoder_norm/scale", "model.norm.weight", ("D",))
LOGITS = Param("decoder/logits_dense/kernel", "lm_head.weight", ("V", "D"), ("transpose",))
NORMS = (
    Param("layers/pre_self_attention_layer_norm/scale", "model.layers.{i}.input_layernorm.weight", ("D",)),
    Param("layers/post_self_attention_layer_norm/scale", "model.layers.{i}.post_attention_layernorm.weight", ("D",)),
)
DENSE_MLP = (
    Param("layers/mlp/wi_0/kernel", "model.layers.{i}.mlp.gate_proj.weight", ("F", "D"), ("transpose",)),
    Param("layers/mlp/wi_1/kernel", "model.layers.{i}.mlp.up_proj.weight", ("F", "D"), ("transpose",)),
    Param("layers/mlp/wo/kernel", "model.layers.{i}.mlp.down_proj.weight", ("D", "F"), ("transpose",)),
)
_ATTN = "model.layers.{i}.self_attn."


def attention(query: tuple[str, ...], key: tuple[str, ...]) -> tuple[Param, ...]:
    """q/k/v kernels [D, heads, head_dim] (W.T reshaped), out [heads, head_dim, D]; ``query``/``key`` add the
    row's RoPE interleave and query scale after the reshape."""
    return (
        Param("layers/self_attention/query/kernel", _ATTN + "q_proj.weight", ("q", "D"), ("heads_in", *query)),
        Param("layers/self_attention/key/kernel", _ATTN + "k_proj.weight", ("kv", "D"), ("heads_in", *key)),
        Param("layers/self_attention/value/kernel", _ATTN + "v_proj.weight", ("kv", "D"), ("heads_in",)),
        Param("layers/self_attention/out/kernel", _ATTN + "o_proj.weight", ("D", "q"), ("heads_out",)),
    )


QWEN_BIASES = (
    Param("layers/self_attention/query/bias", _ATTN + "q_proj.bias", ("q",), ("bias_heads",), optional=True),
    Param("layers/self_attention/key/bias", _ATTN + "k_proj.bias", ("kv",), ("bias_heads",), optional=True),
    Param("layers/self_attention/value/bias", _ATTN + "v_proj.bias", ("kv",), ("bias_heads",), optional=True),
)
QK_NORM = (
    Param("layers/self_attention/query_norm/scale", _ATTN + "q_norm.weight", ("H",)),
    Param("layers/self_attention/key_norm/scale", _ATTN + "k_norm.weight", ("H",)),
)
_MIXTRAL = "model.layers.{i}.block_sparse_moe."
MIXTRAL_MOE = (
    Param("layers/MoeBlock_0/gate/kernel", _MIXTRAL + "gate.weight", ("E", "D"), ("transpose",)),
    Param("layers/MoeBlock_0/wi_0", _MIXTRAL + "experts.{e}.w1.weight", ("F", "D"), ("transpose",)),
    Param("layers/MoeBlock_0/wi_1", _MIXTRAL + "experts.{e}.w3.weight", ("F", "D"), ("transpose",)),
    Param("layers/MoeBlock_0/wo", _MIXTRAL + "experts.{e}.w2.weight", ("D", "F"), ("transpose",)),
)
_QWEN_MOE = "model.layers.{i}.mlp."
QWEN3_MOE = (
    Param("layers/moe_block/gate/kernel", _QWEN_MOE + "gate.weight", ("E", "D"), ("transpose",)),
    Param("layers/moe_block/wi_0", _QWEN_MOE + "experts.{e}.gate_proj.weight", ("Fe", "D"), ("transpose",)),
    Param("layers/moe_block/wi_1", _QWEN_MOE + "experts.{e}.up_proj.weight", ("Fe", "D"), ("transpose",)),
    Param("layers/moe_block/wo", _QWEN_MOE + "experts.{e}.down_proj.weight", ("D", "Fe"), ("transpose",)),
)
_GEMMA_NORMS = (("pre_self_attention_norm", "input_layernorm"),
                ("post_self_attention_norm", "post_attention_layernorm"),
                ("pre_ffw_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm"))


def gemma2_layer(kind: str, offset: int) -> tuple[Param, ...]:
    """One half of MaxText's paired Gemma 2 layer: ``local`` (sliding window) is HF layer 2i, ``global`` 2i+1."""
    pair = (2, offset)
    return (
        *(Param(f"layers/{mt}_{kind}/scale", f"model.layers.{{i}}.{hf}.weight", ("D",), ("norm_plus_one",),
                layer=pair) for mt, hf in _GEMMA_NORMS),
        Param(f"layers/self_attention_{kind}/query/kernel", _ATTN + "q_proj.weight", ("q", "D"),
              ("heads_in", "scale_query"), layer=pair),
        Param(f"layers/self_attention_{kind}/key/kernel", _ATTN + "k_proj.weight", ("kv", "D"), ("heads_in",),
              layer=pair),
        Param(f"layers/self_attention_{kind}/value/kernel", _ATTN + "v_proj.weight", ("kv", "D"), ("heads_in",),
              layer=pair),
        Param(f"layers/self_attention_{kind}/out/kernel", _ATTN + "o_proj.weight", ("D", "q"), ("heads_out",),
              layer=pair),
        *(Param(f"layers/mlp_{kind}/{mt}/kernel", f"model.layers.{{i}}.mlp.{hf}.weight", shape, ("transpose",),
                layer=pair)
          for mt, hf, shape in (("wi_0", "gate_proj", ("F", "D")), ("wi_1", "up_proj", ("F", "D")),
                                ("wo", "down_proj", ("D", "F")))),
    )


GEMMA3_BLOCK = 6  # models/gemma3.py GEMMA3_ATTENTION_PATTERN: 5 sliding-window layers, then 1 global


def gemma3_layer() -> tuple[Param, ...]:
    """One Gemma 3 decoder layer (GEMMA3_MAXTEXT_TO_HF_PARAM_MAPPING's text_params): four norms and the q/k norms
    stored as 1 + w, q/k/v/o reshaped only (MaxText scales the query at run time by its query_pre_attn_scalar,
    so no scale_query), scanned in MaxText's blocks of six."""
    norms = (*_GEMMA_NORMS, ("self_attention/query_norm", "self_attn.q_norm"),
             ("self_attention/key_norm", "self_attn.k_norm"))
    return (
        *(Param(f"layers/{mt}/scale", f"model.layers.{{i}}.{hf}.weight", ("H",) if "self_attn" in hf else ("D",),
                ("norm_plus_one",), block=GEMMA3_BLOCK) for mt, hf in norms),
        *(Param(f"layers/self_attention/{mt}/kernel", f"{_ATTN}{hf}_proj.weight", (rows, "D"), ("heads_in",),
                block=GEMMA3_BLOCK)
          for mt, hf, rows in (("query", "q", "q"), ("key", "k", "kv"), ("value", "v", "kv"))),
        Param("layers/self_attention/out/kernel", _ATTN + "o_proj.weight", ("D", "q"), ("heads_out",),
              block=GEMMA3_BLOCK),
        *(Param(p.maxtext, p.hf, p.shape, p.steps, block=GEMMA3_BLOCK) for p in DENSE_MLP),
    )


_GLOBAL = (EMBED, FINAL_NORM, LOGITS)
_CITE = "maxtext/checkpoint_conversion/utils/param_mapping.py"

ARCHITECTURES: dict[str, Architecture] = {  # row name -> row; plan.choose_row picks by model_type (and RoPE)
    "llama3": Architecture(
        "llama3", ("llama",), "llama3.1-8b",
        (*_GLOBAL, *NORMS, *attention(("interleave", "scale_query"), ("interleave",)), *DENSE_MLP),
        f"{_CITE}: LLAMA31_MAXTEXT_TO_HF_PARAM_MAPPING, LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN "
        "(query: reshape_kernel, adjust_rope, scale_query_layer; key: reshape_kernel, adjust_rope)"),
    "llama": Architecture(  # a Llama without llama3 RoPE scaling: MaxText's llama2 block, HF's RoPE halves
        "llama", ("llama",), "llama2-7b",
        (*_GLOBAL, *NORMS, *attention(("scale_query",), ()), *DENSE_MLP),
        f"{_CITE}: LLAMA31_MAXTEXT_TO_HF_PARAM_MAPPING names; layers/embeddings.py RotaryEmbedding (halves, "
        "no adjust_rope); layers/attentions.py init_query_w (query scaled by 1/sqrt(head_dim))"),
    "mistral": Architecture(
        "mistral", ("mistral",), "mistral-7b",
        (*_GLOBAL, *NORMS, *attention(("scale_query",), ()), *DENSE_MLP),
        f"{_CITE}: LLAMA31_MAXTEXT_TO_HF_PARAM_MAPPING names (models/mistral.py holds the same modules); "
        "MIXTRAL_MAXTEXT_TO_HF_PARAM_HOOK_FN attention hooks (reshape, scale_query_layer, no RoPE permutation)"),
    "qwen3": Architecture(
        "qwen3", ("qwen3",), "qwen3-0.6b",
        (*_GLOBAL, *NORMS, *attention((), ()), *QK_NORM, *DENSE_MLP),
        f"{_CITE}: QWEN_MAXTEXT_TO_HF_PARAM_MAPPING, QWEN_MAXTEXT_TO_HF_PARAM_HOOK_FN (reshape_kernel only)"),
    "qwen2": Architecture(
        "qwen2", ("qwen2",), "qwen2.5-7b",
        (*_GLOBAL, *NORMS, *attention((), ()), *QWEN_BIASES, *DENSE_MLP),
        f"{_CITE}: QWEN_MAXTEXT_TO_HF_PARAM_MAPPING, QWEN_MAXTEXT_TO_HF_PARAM_HOOK_FN (reshape_kernel, "
        "reshape_bias)"),
    "qwen3_moe": Architecture(
        "qwen3_moe", ("qwen3_moe",), "qwen3-30b-a3b",
        (*_GLOBAL, *NORMS, *attention((), ()), *QK_NORM, *QWEN3_MOE),
        f"{_CITE}: QWEN_MAXTEXT_TO_HF_PARAM_MAPPING (num_experts > 1), QWEN_MAXTEXT_TO_HF_PARAM_HOOK_FN "
        "(reshape_kernel, reshape_expert_kernel)", moe=True),
    "mixtral": Architecture(
        "mixtral", ("mixtral",), "mixtral-8x7b",
        (*_GLOBAL, *NORMS, *attention(("scale_query",), ()), *MIXTRAL_MOE),
        f"{_CITE}: MIXTRAL_MAXTEXT_TO_HF_PARAM_MAPPING, MIXTRAL_MAXTEXT_TO_HF_PARAM_HOOK_FN "
        "(reshape_and_transpose_attention, scale_query_layer, reshape_kernel)", moe=True),
    "gemma2": Architecture(  # tied embeddings only (MaxText's gemma2 has logits_via_embedding): no logits_dense
        "gemma2", ("gemma2",), "gemma2-2b",
        (Param(EMBED.maxtext, EMBED.hf, EMBED.shape, ("embed_scale",)),
         Param(FINAL_NORM.maxtext, FINAL_NORM.hf, FINAL_NORM.shape, ("norm_plus_one",)),
         *gemma2_layer("local", 0), *gemma2_layer("global", 1)),
        f"{_CITE}: GEMMA2_MAXTEXT_TO_HF_PARAM_MAPPING (MaxText layer i = HF layers 2i local, 2i+1 global), "
        "GEMMA2_MAXTEXT_TO_HF_PARAM_HOOK_FN (pad_hf_embedding_layer: x sqrt(hidden_size); scale_rmsnorm_layer: "
        "1 + w; reshape_kernel; scale_query_layer)"),
    "gemma3": Architecture(  # text only (Gemma3ForCausalLM; model_type "gemma3": refusals.UNCONVERTED); tied only
        "gemma3", ("gemma3_text",), "gemma3-4b",
        (Param(EMBED.maxtext, EMBED.hf, EMBED.shape, ("embed_scale_bf16",)),
         Param(FINAL_NORM.maxtext, FINAL_NORM.hf, FINAL_NORM.shape, ("norm_plus_one",)), *gemma3_layer()),
        f"{_CITE}: GEMMA3_MAXTEXT_TO_HF_PARAM_MAPPING text_params (HF names without model.language_model's "
        "prefix; scanned: decoder/layers/layers_0..5 over blocks of 6, leftovers in decoder/layers_remainder), "
        "GEMMA3_MAXTEXT_TO_HF_PARAM_HOOK_FN (pad_and_scale_embedding: x bfloat16(sqrt(hidden_size)); "
        "scale_rmsnorm: 1 + w, q/k norms included; reshape_kernel); models/gemma3.py get_query_pre_attn_scalar"),
}
