"""GGUF: the header and its type table."""
