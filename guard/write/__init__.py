"""The one writing layer: ``convert`` and ``fix`` both write checkpoints through it.

plan      -> what is written: source tensors placed under target names (``Mapped``)
produce   -> each tensor's bytes as pieces: byte ranges copied in the kernel, or bands
             read once, permuted in tiles (``transpose``) and cast (``cast``, ``bitviews``)
framing   -> the bytes around bodies: safetensors headers, Flax msgpack maps; ``orbax_layout``
sink      -> the ordered output stream on its own thread, fsynced before publishing
writer    -> shard-by-shard output into a temporary directory
verify    -> the output read back independently (CG301)
publish   -> temp names and renames: nothing half-written at a final name
"""
