"""ckpt-guard: dtype and safety checks for model checkpoints."""

__version__ = "0.1.0"

# Where a message or --help points a user for more: the repository's docs (a pip install has no docs/)
DOCS_URL = "https://github.com/ckpt-guard/ckpt-guard/blob/main/docs/"
