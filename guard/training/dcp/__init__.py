"""PyTorch Distributed Checkpoint: ``metadata`` (``.metadata`` walked with the dcp row's allow-list), ``layout``
(its records), ``integrity`` (CG114-CG116), ``roles`` (which items are the model's, and their keys), ``dirs``
(discovery's claim and the scan; CG117) and ``hf_shards`` (HuggingFaceStorageWriter's safetensors shards).
Megatron-core's torch_dist is DCP plus ``metadata.json`` and ``common.pt`` (``guard.training.megatron``);
``convert``'s streamed consolidation and the torchtitan and Megatron name maps are in ``guard.convert.training``.
"""
