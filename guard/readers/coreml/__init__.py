"""Core ML: MIL blob weights and .mlmodel specs."""
