"""MaxText as a conversion target: ``convert SRC --to maxtext --out OUT [--scan-layers]`` and the way back.

The target's row is ``guard.targets.table``'s ("maxtext"), its layout one literal row per architecture in
``guard.targets.maxtext`` (MaxText's parameter tree as data, written from MaxText's own conversion hooks),
its steps (transpose, reshape, RoPE interleave, the scalings that round) ``guard.convert.steps``'.

source_config -> what config.json says (sizes, tied embeddings, RoPE), under transformers 4's keys or 5's
plan    -> a source model and its config.json against a row: every MaxText leaf with its HF sources,
           or CG304 findings (unsupported architecture, missing tensor, wrong shape, no place)
refusals -> what a row's MaxText block hard-codes and the config contradicts: one reason a line (CG304)
ocdbt   -> MaxText's checkpoint layout: ``OUT/0/items``, Orbax OCDBT + zarr3, ``{"params": {"params": tree}}``
flags   -> the MaxText command-line flags that describe the source config
run     -> the two conversions, streamed one MaxText leaf at a time, published by a rename
"""
