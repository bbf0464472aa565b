"""Hugging Face Hub gate: remote scans, gated uploads, a webhook reviewer.

Feeds Hub files into the same readers, inventory and rules as a local scan
(``scan``, ``remote``), and answers on the Hub (``comment``, ``upload``,
``reviewer``, ``webhook``).  huggingface_hub and the ASGI server are imported
inside the functions (the `hub` extra).  The command wiring lives in
``guard.cli.hub``; nothing here imports the CLI.
"""
