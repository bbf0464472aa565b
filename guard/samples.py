"""Sample repositories in the layouts people publish, written by the real libraries.

`make demo` shows them and the tests build on them: a diffusers pipeline saved
with ``save_pretrained()`` and again with ``variant="fp16"``, and bart-large's
seed case (fp16 PyTorch weights beside an fp32 Flax copy).  Needs the `parity`
extra and diffusers; nothing on the scan path imports this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _params(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def _clip_tokenizer(folder: Path) -> Any:
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "a</w>": 2, "b</w>": 3}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))


def diffusers_pipeline(root: Path, *, variant: str | None = "fp16", max_shard_size: str | None = None) -> dict[str, int]:
    """A tiny Stable Diffusion pipeline saved with save_pretrained(), then again with variant=...

    Returns each component's parameter count, as torch reports it for one copy.
    """
    import torch
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=8, attention_head_dim=2, norm_num_groups=4)
    vae = AutoencoderKL(block_out_channels=(8,), in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                        up_block_types=("UpDecoderBlock2D",), latent_channels=4, norm_num_groups=4)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=16, projection_dim=8))
    pipe = StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=text_encoder,
                                   tokenizer=_clip_tokenizer(root.parent / f".{root.name}-tokenizer"),
                                   scheduler=PNDMScheduler(), safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    counts = {"unet": _params(unet), "vae": _params(vae), "text_encoder": _params(text_encoder)}
    shard = {"max_shard_size": max_shard_size} if max_shard_size else {}
    pipe.save_pretrained(root, **shard)
    if variant is not None:
        pipe.to(torch.float16).save_pretrained(root, variant=variant, **shard)
    return counts


def bart_like_copies(root: Path) -> int:
    """bart-large's seed case: fp16 PyTorch weights, and a Flax copy beside them in fp32."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration, FlaxBartForConditionalGeneration
    from transformers.utils import logging

    torch.manual_seed(0)
    config = BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)
    model = BartForConditionalGeneration(config).half()
    model.save_pretrained(root, safe_serialization=False)
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # from_pt's notes on fp16 weights are about this very sample
    try:
        flax = FlaxBartForConditionalGeneration.from_pretrained(root, from_pt=True)
    finally:
        logging.set_verbosity(verbosity)
    flax.params = flax.to_fp32(flax.params)
    flax.save_pretrained(root)
    model.config.save_pretrained(root)  # config.json describes the PyTorch copy
    return _params(model)
