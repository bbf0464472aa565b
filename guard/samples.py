"""Sample repositories in the layouts people publish, written by the real libraries.

`make demo` shows them and the tests build on them: a diffusers pipeline saved
with ``save_pretrained()`` and again with ``variant="fp16"``, and bart-large's
seed case (fp16 PyTorch weights beside an fp32 Flax copy).  Needs the `parity`
extra and diffusers; nothing on the scan path imports this module.

transformers 5 writes safetensors only and has no Flax classes: the pickled ``pytorch_model.bin`` layout
is written here as transformers 4 wrote it (``save_torch_bin``), and the Flax copy by this tool's own
converter (``flax_copy``, the rules that equal transformers 4's ``from_pt``), so the samples build the
same files under transformers 4 and 5.
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


def diffusers_pipeline(root: Path, *, variant: str | None = "fp16",
                       max_shard_size: str | None = None) -> dict[str, int]:
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
    vae = AutoencoderKL(block_out_channels=(8,), in_channels=3, out_channels=3,
                        down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
                        latent_channels=4, norm_num_groups=4)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=16, projection_dim=8))
    pipe = StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=text_encoder,
                                   tokenizer=_clip_tokenizer(root.parent / f".{root.name}-tokenizer"),
                                   scheduler=PNDMScheduler(), safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    counts = {"unet": _params(unet), "vae": _params(vae), "text_encoder": _params(text_encoder)}
    shard = {"max_shard_size": max_shard_size} if max_shard_size else {}
    pipe.save_pretrained(root, **shard)  # type: ignore[attr-defined]  # DiffusionPipeline's save_pretrained, which its stubs' class does not declare
    if variant is not None:
        pipe.to(torch.float16).save_pretrained(root, variant=variant, **shard)  # type: ignore[attr-defined]  # DiffusionPipeline's to(), which its stubs' class does not declare
    return counts


def save_torch_bin(model: Any, root: Path, *, variant: str | None = None,
                   max_shard_size: int | str | None = None) -> None:
    """What transformers 4's ``save_pretrained(safe_serialization=False)`` wrote: config.json (and the
    generation config), then ``pytorch_model.bin``, or its shards and ``pytorch_model.bin.index.json``,
    pickled by ``torch.save`` with tied weights kept under both names (transformers 4.57's
    ``modeling_utils.save_pretrained``: ``_add_variant`` names, huggingface_hub's shard split)."""
    import shutil
    import tempfile

    import torch
    from huggingface_hub import split_torch_state_dict_into_shards

    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{root.name}-config-") as tmp:
        model.save_pretrained(tmp)  # the configs exactly as this transformers writes them (architectures, dtype)
        for name in ("config.json", "generation_config.json"):
            if (Path(tmp) / name).exists():
                shutil.copyfile(Path(tmp) / name, root / name)
    state = model.state_dict()
    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())  # exact names, as 4.57 drops them
    state = {k: v for k, v in state.items() if k not in ignored}
    weights = "pytorch_model.bin" if variant is None else f"pytorch_model.{variant}.bin"
    split = split_torch_state_dict_into_shards(state, filename_pattern=weights.replace(".bin", "{suffix}.bin"),
                                               max_shard_size=max_shard_size or "50GB")
    for filename, names in split.filename_to_tensors.items():
        torch.save({name: state[name].contiguous() for name in names}, root / filename)
    if split.is_sharded:
        index = "pytorch_model.bin.index.json" if variant is None else f"pytorch_model.bin.index.{variant}.json"
        metadata = {"total_parameters": model.num_parameters(), **split.metadata}  # as 4.57 writes it
        content = {"metadata": metadata, "weight_map": dict(split.tensor_to_filename)}
        (root / index).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def flax_copy(root: Path, *, dtype: str = "keep") -> None:
    """``flax_model.msgpack`` beside the PyTorch weights in ``root``, as transformers 4's
    ``FlaxAutoModel.from_pretrained(root, from_pt=True).save_pretrained(root)`` wrote it (``dtype="fp32"``:
    after ``to_fp32``), written by this tool's converter, which needs no transformers Flax class."""
    import shutil
    import tempfile

    from guard.convert.run import ConvertRequest, convert_model
    from guard.write.cast import DTYPE_CHOICES, CastPolicy

    with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{root.name}-flax-") as tmp:
        out = Path(tmp) / "flax"
        findings, figures = convert_model(ConvertRequest(root, out, "flax", CastPolicy(DTYPE_CHOICES[dtype], ()),
                                                         5 * 2**30, False, False, layout="msgpack"))
        if not figures.get("written"):
            raise RuntimeError(f"{root}: the Flax copy was not written: {[f.message for f in findings]}")
        shutil.move(out / "flax_model.msgpack", root / "flax_model.msgpack")


def bart_like_copies(root: Path) -> int:
    """bart-large's seed case: fp16 PyTorch weights, and a Flax copy beside them in fp32."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)
    model = BartForConditionalGeneration(config).half()
    save_torch_bin(model, root)
    flax_copy(root, dtype="fp32")
    model.config.save_pretrained(root)  # config.json describes the PyTorch copy
    return _params(model)
