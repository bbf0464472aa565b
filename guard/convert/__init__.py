"""PyTorch <-> Flax conversion: bit-exact by default, streamed tensor by tensor.

source  -> SourceModel (files, TensorInfo records, a loader per file)
families -> what each architecture holds (a literal row per model_type); rules -> one tensor's PT<->Flax name
naming  -> every tensor's target name and layout, or a decision (dropped buffer, tied alias, ...)
cast    -> explicit dtype casts, checked for overflow (CG201)
writer  -> shard-by-shard output in a temporary directory, verified, then renamed
run     -> the whole conversion, as findings plus figures for the report
"""
