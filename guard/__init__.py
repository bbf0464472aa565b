"""ckpt-guard: dtype and safety checks for model checkpoints."""

__version__ = "0.1.0"
