"""What EasyDeL 0.3's forward is known to do differently from transformers', named on its forward findings (the
causes are data on its row, ``guard.targets.table``).

Both were measured on the tiny fp32 Qwen3 of tests/test_parity_against.py (every parameter bit-exact):
- its ``Qwen3Config`` / ``LlamaConfig`` take ``rope_theta`` as a top-level key only (default 10000.0);
  transformers 5 writes it inside ``rope_parameters``, so EasyDeL's RoPE runs at base 10000 (0.19 of the
  logits' scale at rope_theta 1e6).  ``config_kwargs={"rope_theta": ...}`` sets it.
- ``EasyDeLBaseConfig.get_basic_frequencies`` (easydel/infra/base_config.py) casts the cos/sin table
  every layer reads to bfloat16 whatever the model's dtype: up to 3.8e-3 of an entry off past position
  0 (position 0 is exact, so one token agrees), 7.7e-4 of the logits' scale in fp32; with the table
  left in float32 the logits agree to 3e-7.  No option reaches it.  transformers rounds its own table to
  the activations' dtype, so a bf16 pass rounds it alike (an fp16 pass does not: fp16 keeps more bits).
"""

from __future__ import annotations

from typing import Any

# the exact load's worker option (passes config.json's rope_parameters["rope_theta"] as config_kwargs) and how
# the worker reads that value: the worker's own, as the worker side never imports this layer
from guard.targets.table import ROPE_THETA_FROM_FILE
from guard.worker.easydel_side import nested_rope_theta

__all__ = ["DEFAULT_ROPE_THETA", "ROPE_THETA_FROM_FILE", "forward_causes", "nested_rope_theta"]

DEFAULT_ROPE_THETA = 10000.0  # EasyDeL 0.3's Qwen3Config and LlamaConfig default


def forward_causes(config: dict[str, Any], options: dict[str, Any], dtype: str) -> tuple[str, ...]:
    """The known differences behind a load's failing forward comparison computed in ``dtype`` (F32, BF16, F16):
    the causes on EasyDeL's row (``guard.targets.table``) that apply."""
    from guard.against.causes import known_causes
    from guard.targets.table import TARGETS

    return known_causes(TARGETS["easydel"], config, options, dtype)
