"""PyTorch <-> Flax conversion: bit-exact by default, streamed tensor by tensor.

source  -> SourceModel (files, TensorInfo records, a loader per file)
naming  -> target names and layouts against the target architecture's template
cast    -> explicit dtype casts, checked for overflow (CG201)
writer  -> shard-by-shard output in a temporary directory, verified, then renamed
run     -> the whole conversion, as findings plus figures for the report
"""
