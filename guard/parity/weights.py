"""One side's stored weights, read a tensor at a time, under the names its model class asks for.

The streamed runs (``guard.parity.stream_torch``, ``guard.parity.stream_flax``) never hold a
whole checkpoint: they read each tensor when the block that uses it runs, through the same
lazy readers ``convert`` uses (byte ranges of safetensors and msgpack files, shard by shard).

Names follow transformers' own loading rule: a base model loaded from a head checkpoint drops
the ``base_model_prefix`` (``bert.``), a head model loaded from a base checkpoint adds it.
Anything this reader cannot place exactly is ``NotStreamable``: the caller then runs the whole
model through transformers, which reports it as it always did (CG001, CG304).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard.findings import Severity


class NotStreamable(Exception):
    """This model cannot be streamed block by block; run it whole (the reason says why)."""


class CheckpointWeights:
    """``framework`` "torch" reads model.safetensors / pytorch_model.bin, "flax" flax_model.msgpack."""

    def __init__(self, directory: Path, framework: str, *, separator: str) -> None:
        from guard.convert.read.source import open_source
        from guard.errors import GuardError

        try:  # open_source prefers the copy that is not `to`'s framework
            source = open_source(Path(directory), to="flax" if framework == "torch" else "torch")
        except (GuardError, OSError, ValueError) as exc:
            raise NotStreamable(f"weights not readable a tensor at a time: {exc}") from None
        if source.framework != framework:
            raise NotStreamable(f"no {framework} weights in {directory}")
        if any(f.severity is Severity.error for f in source.findings):
            raise NotStreamable("the weight files have findings of their own")
        self.separator = separator
        self.tensors = {t.name: t for t in source.tensors}

    def naming(self, model_names: set[str], prefix: str) -> dict[str, str | None]:
        """Model name -> stored name (None when absent), with transformers' prefix rule."""
        return stored_naming(model_names, set(self.tensors), prefix, self.separator)

    def shape(self, stored: str) -> tuple[int, ...]:
        return tuple(self.tensors[stored].info.shape)

    def load(self, stored: str) -> Any:
        """The stored tensor as numpy, in its stored dtype (ml_dtypes for bf16).  A chunked Flax leaf is
        read chunk by chunk by its loader (``guard.convert.read.flax_chunks``), never by decoding its whole file."""
        from guard.errors import GuardError

        tensor = self.tensors[stored]
        try:
            return tensor.load()
        except (GuardError, OSError, ValueError) as exc:
            raise NotStreamable(f"{stored}: {exc}") from None


def stored_naming(model_names: set[str], stored_names: set[str], prefix: str,
                  sep: str) -> dict[str, str | None]:
    """transformers' rule: a base model drops a stored ``prefix``, a head model adds a missing one."""
    head = f"{prefix}{sep}" if prefix else None
    model_prefixed = head is not None and any(n.startswith(head) for n in model_names)
    stored_prefixed = head is not None and any(n.startswith(head) for n in stored_names)

    def stored(name: str) -> str | None:
        if head is not None and model_prefixed and not stored_prefixed and name.startswith(head):
            name = name[len(head):]
        elif head is not None and stored_prefixed and not model_prefixed:
            name = head + name
        return name if name in stored_names else None

    return {name: stored(name) for name in model_names}


def to_torch(array: Any, dtype: Any) -> Any:
    """A numpy array (bf16 via ml_dtypes) as a torch tensor; floating ones cast to ``dtype``."""
    import numpy as np
    import torch

    if array.dtype.name == "bfloat16":
        tensor = torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor
