"""PyTorch Distributed Checkpoint: ``metadata`` (the allow-list walker of ``.metadata``), ``layout`` (its
records), ``integrity`` (CG114-CG116), ``roles`` (which items are the model's, and their keys), ``dirs``
(discovery's claim and the scan; CG117), ``hf_shards`` (HuggingFaceStorageWriter's safetensors shards),
``source`` (``convert``'s streamed consolidation) and ``torchtitan`` (its Llama names and q/k order as HF's).
"""
