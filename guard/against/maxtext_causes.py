"""What MaxText 0.2.5's forward does differently from transformers' for tied embeddings: named on its
forward findings, and computed into a second reference that tells "only these conventions" from
"something else" (the tree itself is exact; these are conventions of its decoder and its conversion).

- ``layers/embeddings.py`` ``attend_on_embedding`` computes tied logits from the embedding table cast to
  bfloat16, whatever ``dtype`` and ``weight_dtype`` are: an fp32 run's logits carry bf16 rounding.
- Gemma's table is stored times sqrt(hidden_size) (Gemma 2's hook in float32; Gemma 3's hook times
  sqrt(hidden_size) *rounded to bfloat16*, which ``convert --to maxtext`` declares as CG301), looked up as
  it is, and the logits are divided by the exact square root (``normalize_embedding_logits``).
Measured in tests/test_convert_maxtext.py: with both conventions in the reference (``tied_logits_as_maxtext``)
MaxText's own forward agrees to ~5e-6; against transformers' plain logits the tiny models miss by ~2e-3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONVENTIONS = "transformers' fp32 forward with MaxText's tied-logit conventions"


def forward_causes(config: dict[str, Any], options: dict[str, Any], dtype: str) -> tuple[str, ...]:
    """The conventions behind a failing comparison computed in ``dtype`` (F32, BF16, F16): the causes on
    MaxText's row (``guard.targets.table``) that apply."""
    from guard.against.causes import known_causes
    from guard.targets.table import TARGETS

    return known_causes(TARGETS["maxtext"], config, options, dtype)


def embed_step(config: dict[str, Any]) -> str | None:
    """The row's embedding step (``embed_scale``: Gemma 2; ``embed_scale_bf16``: Gemma 3), None for a table
    stored as it is."""
    from guard.convert.maxtext.plan import choose_row

    row = choose_row(config)
    steps = [s for p in (row.params if row else ()) for s in p.steps if s.startswith("embed_scale")]
    return steps[0] if steps else None


def tied_logits_as_maxtext(model: Any, input_ids: Any, *, step: str | None) -> Any:
    """transformers' fp32 forward of ``model`` (a ...ForCausalLM in float32) up to the final norm, then the
    tied logits as MaxText computes them: the stored table (Gemma's times sqrt(hidden_size), as ``step``
    stores it; Gemma 3's rows are also looked up as stored) rounded to bfloat16, divided by
    sqrt(hidden_size) for Gemma, then the final softcap.  ``model`` is changed (Gemma 3's embed_scale)."""
    import ml_dtypes
    import numpy as np
    import torch

    from guard.convert.steps import STEPS, bfloat16_sqrt

    embeddings = model.get_input_embeddings()
    table = embeddings.weight.detach().float().numpy()
    if step == "embed_scale_bf16":  # the rows MaxText looks up: x bfloat16(sqrt(D)), not x sqrt(D)
        embeddings.embed_scale.fill_(bfloat16_sqrt(table.shape[-1]))
    with torch.no_grad():
        hidden = model.base_model(torch.as_tensor(np.asarray(input_ids)).long()).last_hidden_state.numpy()
    if step:
        table = STEPS[step][0](table, 0)
    logits = hidden @ table.astype(ml_dtypes.bfloat16).astype(np.float32).T
    if step:
        logits = logits / np.float32(np.sqrt(table.shape[-1]))
    cap = getattr(model.config, "final_logit_softcapping", None)
    return np.tanh(logits / cap) * cap if cap else logits


def conventional_reference(src: Path, config: dict[str, Any], input_ids: Any) -> dict[str, Any] | None:
    """The fp32 logits MaxText's forward should give for this file if only its conventions differ from
    transformers'; None where none apply (untied embeddings)."""
    from guard.convert.maxtext.source_config import tied

    if not tied(config):
        return None
    import torch
    import transformers

    from guard.parity.runs import tables_in_fp32

    cls = getattr(transformers, (config.get("architectures") or [""])[0])  # loaded by the plain run already
    model = cls.from_pretrained(src, torch_dtype=torch.float32, attn_implementation="eager",
                                local_files_only=True).eval()
    tables_in_fp32(model)
    return {"logits": tied_logits_as_maxtext(model, input_ids, step=embed_step(config))}
