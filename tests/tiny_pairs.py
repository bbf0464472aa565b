"""Every PyTorch/Flax pair transformers 4.57 has, enumerated from its own auto mappings, with tiny configs.

The pairs come from ``FLAX_MODEL*_MAPPING_NAMES`` (the PyTorch twin is the Flax name minus "Flax"),
so a class transformers adds shows up here, never as a silent gap. Tiny means 1-2 layers, width
16-32, vocab 99: every model builds in well under a second.
"""

from __future__ import annotations

from typing import Any

SIZES: dict[str, Any] = {
    "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 37, "max_position_embeddings": 64, "num_key_value_heads": 2, "head_dim": 8,
    "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 37, "decoder_ffn_dim": 37, "n_embd": 32, "n_layer": 2,
    "n_head": 4, "n_positions": 64, "n_ctx": 64, "d_ff": 37, "d_kv": 8, "num_layers": 2, "num_heads": 4,
    "num_decoder_layers": 1, "ffn_dim": 37, "word_embed_proj_dim": 32, "embedding_size": 16,
    "image_size": 32, "patch_size": 8, "projection_dim": 16, "rotary_dim": 4, "dim": 32, "hidden_dim": 37,
    "n_layers": 2, "n_heads": 4, "max_source_positions": 16, "max_target_positions": 32, "num_mel_bins": 8,
    "attention_types": [[["global", "local"], 1]], "window_size": 8, "local_radius": 2,
    "type_vocab_size": 2, "embedding_dim": 32,
}
OVERRIDES: dict[str, dict[str, Any]] = {
    "albert": {"embedding_size": 16, "num_hidden_groups": 1},
    "big_bird": {"attention_type": "original_full"},
    "roformer": {"embedding_size": 32},  # Flax RoFormer has no embeddings_project: embedding_size must be hidden_size
    "bloom": {"n_layer": 2, "n_head": 4},
    "gemma": {"head_dim": 8, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh"},
    "marian": {"pad_token_id": 0, "decoder_start_token_id": 0, "eos_token_id": 2, "bos_token_id": 1,
               "forced_eos_token_id": 2, "decoder_vocab_size": 99},
    "longt5": {"encoder_attention_type": "local"},
    "resnet": {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": 3},
    "regnet": {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "groups_width": 8,
               "num_labels": 3},
    "wav2vec2": {"conv_dim": [16, 16], "conv_kernel": [3, 3], "conv_stride": [2, 2],
                 "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2,
                 "codevector_dim": 16, "proj_codevector_dim": 16, "num_codevectors_per_group": 4,
                 "num_codevector_groups": 2, "classifier_proj_size": 16, "tdnn_dim": [16], "tdnn_kernel": [3],
                 "tdnn_dilation": [1], "xvector_output_dim": 16, "do_stable_layer_norm": True,
                 "feat_extract_norm": "layer"},
    "whisper": {"vocab_size": 99, "decoder_start_token_id": 1, "pad_token_id": 0, "bos_token_id": 1,
                "eos_token_id": 2, "suppress_tokens": [], "begin_suppress_tokens": []},
    "vit": {"num_labels": 3}, "beit": {"num_labels": 3, "use_mean_pooling": True}, "dinov2": {"num_labels": 3},
}
COMPOSITES: dict[str, tuple[str, str]] = {  # model_type -> (encoder / vision part, decoder / text part)
    "encoder-decoder": ("bert", "bert"),
    "vision-encoder-decoder": ("vit", "gpt2"),
    "speech-encoder-decoder": ("wav2vec2", "bart"),
    "vision-text-dual-encoder": ("vit", "bert"),
}


def pairs() -> list[tuple[str, str, str]]:
    """(model_type, PyTorch class, Flax class) for every Flax class in transformers' auto mappings."""
    import transformers
    from transformers.models.auto import modeling_flax_auto

    found: set[tuple[str, str, str]] = set()
    for name in dir(modeling_flax_auto):
        if name.startswith("FLAX_MODEL") and name.endswith("_MAPPING_NAMES"):
            for model_type, flax_name in getattr(modeling_flax_auto, name).items():
                pt_name = flax_name.removeprefix("Flax")
                if model_type == "gpt-sw3":
                    continue  # gpt-sw3 is GPT-2's classes under another tokenizer: the gpt2 rows cover it
                found.add((model_type, PT_TWIN.get(pt_name, pt_name), flax_name))
    assert all(hasattr(transformers, pt) for _, pt, _ in found), [p for p in found if not hasattr(transformers, p[1])]
    return sorted(found)


PT_TWIN = {"BertForCausalLM": "BertLMHeadModel"}  # transformers' own naming difference


def _sized(cls: Any, model_type: str) -> Any:
    """Built through the constructor, so derived fields (wav2vec2's conv layer count) follow."""
    default = cls()
    wanted = {**SIZES, **OVERRIDES.get(model_type, {})}
    return cls(**{k: v for k, v in wanted.items() if hasattr(default, k) or k in OVERRIDES.get(model_type, {})})


def tiny_config(model_type: str) -> Any:
    import transformers

    cls = transformers.CONFIG_MAPPING[model_type]
    if model_type in COMPOSITES:
        first, second = (_sized(transformers.CONFIG_MAPPING[t], t).to_dict() for t in COMPOSITES[model_type])
        if model_type == "vision-text-dual-encoder":
            return cls(vision_config=first, text_config=second, projection_dim=16)
        if model_type in ("vision-encoder-decoder", "speech-encoder-decoder", "encoder-decoder"):
            second.update(is_decoder=True, add_cross_attention=True)
            config = cls(encoder=first, decoder=second)
            config.decoder_start_token_id, config.pad_token_id = 1, 0
            if model_type == "speech-encoder-decoder":
                config.encoder.hidden_size = config.decoder.d_model  # no projection layer in Flax either
                config.decoder.max_position_embeddings = 512  # Flax's init feeds 255 decoder positions
            return config
    if model_type == "clip":
        text = _sized(transformers.CLIPTextConfig, model_type).to_dict()
        vision = _sized(transformers.CLIPVisionConfig, model_type).to_dict()
        return cls(text_config=text, vision_config=vision, projection_dim=16)
    return _sized(cls, model_type)


def reference_tree(flax_cls: Any, config: Any) -> dict[tuple[str, ...], tuple[int, ...]]:
    """transformers' own Flax parameter tree (shapes only where it allows), the reference the rules must equal.

    Composite classes refuse ``_do_init=False`` and the T5 family's init calls ``jnp.clip(a_max=)``,
    which jax 0.10 removed: those are built for real (tiny) with a clip that takes the old keywords.
    """
    import jax.numpy as jnp
    from flax.traverse_util import flatten_dict

    clip = jnp.clip

    def old_clip(x: Any, a_min: Any = None, a_max: Any = None, **kw: Any) -> Any:
        return clip(x, kw.pop("min", a_min), kw.pop("max", a_max), **kw)

    jnp.clip = old_clip
    try:
        try:
            tree = flax_cls(config, _do_init=False).params_shape_tree
        except ValueError:  # "cannot be created without initializing"
            tree = flax_cls(config).params
    finally:
        jnp.clip = clip
    return {k: tuple(v.shape) for k, v in flatten_dict(dict(tree)).items()}
