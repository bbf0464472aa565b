"""Training checkpoints as conversion sources: a trainer's sharded state read back as the model it holds.

``guard.training`` reads what a trainer wrote (headers, partitions, metadata) into records; the modules
here build on those records the lazily read ``SourceModel`` that ``convert`` writes from, and so sit
above ``guard.write``'s ``SourceTensor`` and ``guard.convert.read.source``.  Which module opens which
trainer's checkpoint is the trainer's row in ``guard.training.registry.TRAINERS``.

``deepspeed`` and ``dcp`` open a checkpoint (``find_checkpoint``, ``open_checkpoint``); ``torchtitan`` and
``megatron`` give a trainer's own names as HF's; ``values`` assembles a logical tensor for ``diff --values``.
"""
