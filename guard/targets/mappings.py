"""The mappings of the stacks that read a Hugging Face checkpoint themselves, as data.

Per model_type, one row per tensor: the HF name (a regex; the layer index, where there is one, its
first group), the name the library holds it under (a template whose ``{i}`` is that index), and the
steps of ``guard.convert.steps`` that turn the file's array into the library's.  Each is written
from the library's own conversion code, which its target row cites (``guard.targets.table``).

The libraries' own words, in the one vocabulary: tunix's ``transpose (1, 0)`` then ``reshape`` to
[hidden, heads, head_dim], and keras-hub's ``np.transpose`` then reshape to the Keras variable's
shape, are ``heads_in`` (q/k/v) and ``heads_out`` (o_proj) on a matrix.
"""

from __future__ import annotations

Mapped = tuple[str, str, tuple[str, ...]]  # (HF name regex, library name template, steps)

TUNIX_DECODER: tuple[Mapped, ...] = (
    (r"model\.embed_tokens\.weight", "embedder.input_embedding", ()),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", "layers.{i}.attn.q_proj.w", ("heads_in",)),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", "layers.{i}.attn.k_proj.w", ("heads_in",)),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", "layers.{i}.attn.v_proj.w", ("heads_in",)),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", "layers.{i}.attn.o_proj.w", ("heads_out",)),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", "layers.{i}.mlp.gate_proj.kernel", ("transpose",)),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", "layers.{i}.mlp.up_proj.kernel", ("transpose",)),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", "layers.{i}.mlp.down_proj.kernel", ("transpose",)),
    (r"model\.norm\.weight", "final_norm.w", ()),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "layers.{i}.input_layernorm.w", ()),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "layers.{i}.post_attention_layernorm.w", ()),
    (r"lm_head\.weight", "lm_head.w", ("transpose",)),
)
TUNIX_QK_NORM: tuple[Mapped, ...] = (
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", "layers.{i}.attn.q_norm.w", ()),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", "layers.{i}.attn.k_norm.w", ()),
)

# keras-hub's port_weight hooks: np.transpose (all axes) then reshape to the Keras variable's shape.
_KERAS_ATTN = "transformer_layer_{i}/self_attention/"
KERAS_DECODER: tuple[Mapped, ...] = (
    (r"model\.embed_tokens\.weight", "token_embedding/embeddings", ()),
    (r"lm_head\.weight", "token_embedding/reverse_embeddings", ("transpose",)),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "transformer_layer_{i}/self_attention_layernorm/scale", ()),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "transformer_layer_{i}/feedforward_layernorm/scale",
     ()),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", _KERAS_ATTN + "query/kernel", ("heads_in",)),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", _KERAS_ATTN + "key/kernel", ("heads_in",)),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", _KERAS_ATTN + "value/kernel", ("heads_in",)),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", _KERAS_ATTN + "attention_output/kernel", ("heads_out",)),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", "transformer_layer_{i}/feedforward_gate_dense/kernel",
     ("transpose",)),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", "transformer_layer_{i}/feedforward_intermediate_dense/kernel",
     ("transpose",)),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", "transformer_layer_{i}/feedforward_output_dense/kernel",
     ("transpose",)),
    (r"model\.norm\.weight", "sequence_output_layernorm/scale", ()),
)
KERAS_QK_NORM: tuple[Mapped, ...] = (
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", _KERAS_ATTN + "query_dense_layernorm/scale", ()),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", _KERAS_ATTN + "key_dense_layernorm/scale", ()),
)

# EasyDeL's StateDictConverter.process_tensor: ``weight`` of a Linear -> ``kernel`` transposed, of an
# Embedding -> ``embedding``, of a norm -> ``kernel``; the rest of the name is the HF name.
EASYDEL_DECODER: tuple[Mapped, ...] = (
    (r"model\.embed_tokens\.weight", "model.embed_tokens.embedding", ()),
    *((rf"model\.layers\.(\d+)\.self_attn\.{p}_proj\.weight", f"model.layers.{{i}}.self_attn.{p}_proj.kernel",
       ("transpose",)) for p in "qkvo"),
    *((rf"model\.layers\.(\d+)\.mlp\.{p}_proj\.weight", f"model.layers.{{i}}.mlp.{p}_proj.kernel", ("transpose",))
      for p in ("gate", "up", "down")),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "model.layers.{i}.input_layernorm.kernel", ()),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "model.layers.{i}.post_attention_layernorm.kernel",
     ()),
    (r"model\.norm\.weight", "model.norm.kernel", ()),
    (r"lm_head\.weight", "lm_head.kernel", ("transpose",)),
)
EASYDEL_QK_NORM: tuple[Mapped, ...] = (
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", "model.layers.{i}.self_attn.q_norm.kernel", ()),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", "model.layers.{i}.self_attn.k_norm.kernel", ()),
)
