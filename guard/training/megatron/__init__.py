"""Megatron-core's checkpoints: the save folder's tracker (``dirs``) and the non-sharded ``common.pt`` (``common``).

An iteration folder is ``torch_dist``: DCP's files, read by ``guard.training.dcp``, beside ``metadata.json``
and ``common.pt``.  Converting one, Megatron's names become HF's in ``guard.convert.training.megatron``.
"""
