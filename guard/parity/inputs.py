"""Seeded inputs for a Flax class's ``__call__``, sized from the model's config or sub-configs.

The same numpy arrays go to both sides; names the PyTorch side lacks are dropped there, and the
speech composite's Flax ``inputs`` is fed as ``input_values`` (``guard.parity.runs``).
"""

from __future__ import annotations

import inspect
from typing import Any

from guard.parity.runs import Unavailable as _Unavailable

BATCH, SEQ_LEN, IMAGE_BATCH, AUDIO_SAMPLES = 2, 16, 2, 3200


def make_inputs(config: Any, flax_cls: Any, *, seed: int) -> dict[str, Any]:
    """Seeded inputs for whatever the Flax model's __call__ takes, sized from the (sub-)configs."""
    import numpy as np

    accepted = set(inspect.signature(flax_cls.__call__).parameters)
    rng = np.random.default_rng(seed)
    encoder = getattr(config, "encoder", None)
    decoder = getattr(config, "decoder", None)
    text = getattr(config, "text_config", None) or config
    vision = getattr(config, "vision_config", None) or encoder or config
    inputs: dict[str, Any] = {}
    if "input_ids" in accepted:
        inputs["input_ids"] = _token_ids(rng, encoder if encoder is not None else text, "input_ids")
    if "decoder_input_ids" in accepted:
        inputs["decoder_input_ids"] = _token_ids(rng, decoder if decoder is not None else text, "decoder_input_ids")
    eos = getattr(encoder if encoder is not None else text, "eos_token_id", None)
    if "input_ids" in inputs and "SequenceClassification" in flax_cls.__name__ and isinstance(eos, int):
        inputs["input_ids"][:, -1] = eos  # BART-style heads classify from the final <eos>
    if "input_ids" in inputs and "attention_mask" in accepted:
        inputs["attention_mask"] = np.ones_like(inputs["input_ids"])
    if "input_ids" in inputs and "token_type_ids" in accepted:
        # explicit, as the two sides' defaults differ (Flax ELECTRA defaults to ones, PyTorch to zeros)
        inputs["token_type_ids"] = np.zeros_like(inputs["input_ids"])
    if "pixel_values" in accepted:
        size = getattr(vision, "image_size", None) or _convnet_side(vision)
        size = size if isinstance(size, int) else int(size[0])
        channels = getattr(vision, "num_channels", 3)
        inputs["pixel_values"] = rng.standard_normal((IMAGE_BATCH, channels, size, size)).astype(np.float32)
    if "input_features" in accepted:  # Whisper: log-mel frames, twice the encoder's positions
        audio = encoder if encoder is not None else config
        frames = 2 * int(getattr(audio, "max_source_positions", 1500))
        mels = int(getattr(audio, "num_mel_bins", 80))
        inputs["input_features"] = rng.standard_normal((BATCH, mels, frames)).astype(np.float32)
    if "input_values" in accepted or ("inputs" in accepted and encoder is not None):
        # wav2vec2 (the speech composite names it `inputs` in Flax): raw audio, long enough for the strides
        inputs["input_values"] = rng.standard_normal((BATCH, AUDIO_SAMPLES)).astype(np.float32)
    if "MultipleChoice" in flax_cls.__name__:  # [batch, choices, length]
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            if name in inputs:
                inputs[name] = np.stack([inputs[name], inputs[name][::-1]], axis=1)
    if not inputs:
        wanted = [p for p in accepted if p not in ("self", "params", "dropout_rng", "train")]
        raise _Unavailable(f"{flax_cls.__name__} takes inputs this tool does not build ({', '.join(wanted)})")
    return inputs


def _convnet_side(config: Any) -> int:
    """An image whose last feature map is 7 x 7, as ImageNet's 224 gives a 4-stage ResNet or RegNet.

    Their configs name no image size.  Both stride 2^(stages + 1) in all (ResNet: a stem of 4, then 2
    per stage after the first; RegNet: a stem of 2, then 2 per stage).  224 through a 2-stage tiny
    model would leave 28 x 28, and Flax's ``avg_pool`` sums all 784 positions in bf16: an error of
    0.09 - 0.25 of the output's scale that no real checkpoint at its own input size sees."""
    stages = getattr(config, "hidden_sizes", None)
    if isinstance(stages, list | tuple) and 0 < len(stages) <= 6:
        return 7 * 2 ** (len(stages) + 1)
    return 224


def _token_ids(rng: Any, config: Any, name: str) -> Any:
    import numpy as np

    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 2:
        raise _Unavailable(f"config has no usable vocab_size for {name}")
    limit = getattr(config, "max_position_embeddings", None)
    length = min(SEQ_LEN, limit - 2) if isinstance(limit, int) and limit > 4 else SEQ_LEN
    # Special tokens change positions (RoBERTa counts from the pad id) or masks: avoid them.
    specials = {getattr(config, k, None) for k in ("pad_token_id", "bos_token_id", "eos_token_id",
                                                   "decoder_start_token_id")}
    allowed = np.setdiff1d(np.arange(vocab), [s for s in specials if isinstance(s, int)])
    return rng.choice(allowed if allowed.size else np.arange(vocab), size=(BATCH, length)).astype(np.int32)
