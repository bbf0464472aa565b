"""PyTorch <-> Flax conversion: bit-exact by default, streamed tensor by tensor.

The folders are the pipeline ``run`` drives:

read/   -> reading the source: ``SourceModel`` (files, TensorInfo records, a loader per tensor)
map/    -> mapping the names: ``families`` (what each architecture holds, a literal row per
           model_type), ``rules`` (one tensor's PT <-> Flax name), ``naming`` (every tensor's
           target, or a decision: dropped buffer, tied alias, ...)
guard/write (shared with ``fix``) -> writing the output: casts, streamed shards in a temporary
           directory, verification, then a rename
run     -> the whole conversion, as findings plus figures for the report; ``carry`` brings
           config.json and the tokenizer files along
"""
