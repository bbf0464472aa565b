"""PyTorch Distributed Checkpoint: ``metadata`` (the allow-list walker of ``.metadata``), ``layout`` (its
records), ``integrity`` (CG114-CG116), ``roles`` (which items are the model's, and their keys), ``dirs``
(discovery's claim and the scan; CG117), ``hf_shards`` (HuggingFaceStorageWriter's safetensors shards),
``source`` (``convert``'s streamed consolidation) and ``torchtitan`` (its Llama names and q/k order as HF's).
Megatron-core's torch_dist (DCP plus ``metadata.json`` and ``common.pt``): ``megatron_common`` (common.pt's
allow-list walk, CG003), ``megatron_dirs`` (the save folder's ``latest_checkpointed_iteration.txt``, CG119;
NeMo 2's ``weights/`` beside ``context/``) and ``megatron`` (its GPTModel as HF Llama: layers unstacked,
fused q/k/v and gate/up split).
"""
