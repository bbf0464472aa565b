"""What MaxText 0.2.5's forward does differently from transformers' for tied embeddings, named on its
forward findings (the tree itself is exact; these are conventions of its decoder and its conversion).

- ``layers/embeddings.py`` ``attend_on_embedding`` computes tied logits from the embedding table cast to
  bfloat16, whatever ``dtype`` and ``weight_dtype`` are: an fp32 run's logits carry bf16 rounding.
- Gemma 3's conversion hook stores the embedding times sqrt(hidden_size) *rounded to bfloat16*
  (``param_mapping.py``; ``convert --to maxtext`` declares it as CG301), while the decoder divides the
  logits by the exact square root: both its inputs and its logits scale by bf16(sqrt D) / sqrt D.
Measured in tests/test_convert_maxtext.py: with both conventions in the reference (``tied_logits_as_maxtext``)
MaxText's own forward agrees to ~5e-6; against transformers' plain logits the tiny models miss by ~2e-3.
"""

from __future__ import annotations

from typing import Any


def forward_causes(config: dict[str, Any], options: dict[str, Any], dtype: str) -> tuple[str, ...]:
    """The conventions behind a failing comparison computed in ``dtype`` (F32, BF16, F16)."""
    from guard.convert.maxtext.source_config import tied

    if dtype != "F32" or not tied(config):  # in bf16 transformers' logits carry the same rounding
        return ()
    causes = ["MaxText computes tied logits from the embedding table rounded to bfloat16 in every dtype "
              "(layers/embeddings.py attend_on_embedding): no flag avoids it"]
    if str(config.get("model_type", "")).startswith("gemma3"):
        causes.append("its gemma3 conversion stores the embedding times sqrt(hidden_size) rounded to bfloat16 "
                      "(param_mapping.py's embedding hook; the conversion's CG301), so its inputs and logits "
                      "scale by bf16(sqrt(hidden_size)) / sqrt(hidden_size)")
    return tuple(causes)
