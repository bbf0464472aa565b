"""MaxText as a conversion target: ``convert SRC --to maxtext --out OUT [--scan-layers]`` and the way back.

table   -> the target row (library, versions, writer, forward, environment) and one literal row per
           architecture: MaxText's parameter tree as data, written from MaxText's own conversion hooks
steps   -> the named array steps a row's parameters use (transpose, reshape, RoPE interleave, query
           scale), each with its inverse; the query scale is the one declared rounding
source_config -> what config.json says (sizes, tied embeddings, RoPE), under transformers 4's keys or 5's
plan    -> a source model and its config.json against a row: every MaxText leaf with its HF sources,
           or CG304 findings (unsupported architecture, missing tensor, wrong shape, no place)
refusals -> what a row's MaxText block hard-codes and the config contradicts: one reason a line (CG304)
ocdbt   -> MaxText's checkpoint layout: ``OUT/0/items``, Orbax OCDBT + zarr3, ``{"params": {"params": tree}}``
flags   -> the MaxText command-line flags that describe the source config
run     -> the two conversions, streamed one MaxText leaf at a time, published by a rename
"""
