"""Hugging Face Hub gate: remote scans, gated uploads, a webhook reviewer."""
