"""What can be checked about a checkpoint's shapes and completeness without building the model.

- Repeated blocks (``layers.N``, ``h.N``, ``block.N``) are numbered 0..n-1 without a gap, and a
  tensor a later block holds is in every block: a tensor missing from one layer, or a layer
  missing, is CG304 (transformers would leave it random).  Only the first block may hold extras.
- A norm's length and an embedding table's row count must be a size the config names
  (``hidden_size``, ``d_model``, ``vocab_size``, ...; any integer in it, nested configs too).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from guard.catalogue import make_finding
from guard.findings import Finding
from guard.write.plan import Mapped

NORM_MODULE = re.compile(r"(layer_?norm|^norm$|^ln_|_ln$|^ln$|layrnorm|_norm$)", re.IGNORECASE)
LAYER_LISTS = ("layer", "layers", "h", "block", "blocks", "conv_layers", "stages")  # not any nn.Sequential
ALIKE = ("layer", "layers", "h", "block", "blocks")  # blocks of one kind (a ResNet's stages differ by design)
VOCAB_MODULE = re.compile(r"^(word_embeddings|embed_tokens|wte|shared|token_embedding)$")


def config_sizes(config: Any) -> set[int]:
    return set(_ints(config))


def _ints(obj: Any) -> Iterator[int]:
    if isinstance(obj, bool):
        return
    if isinstance(obj, int):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _ints(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _ints(value)


def vocab_sizes(config: Any) -> set[int]:
    found: set[int] = set()
    if isinstance(config, dict):
        for key, value in config.items():
            if key in ("vocab_size", "decoder_vocab_size") and isinstance(value, int) and not isinstance(value, bool):
                found.add(value)
            elif isinstance(value, dict):
                found |= vocab_sizes(value)
    return found


def check_shapes(tensors: list[Mapped], config: dict[str, Any], *, architecture: str) -> list[Finding]:
    sizes, vocabs = config_sizes(config), vocab_sizes(config)
    findings = []
    for m in tensors:
        parts = m.source.name.replace("/", ".").split(".")
        module = parts[-2] if len(parts) > 1 else ""
        shape = m.source.info.shape
        if len(shape) == 1 and parts[-1] in ("weight", "gamma", "scale") and NORM_MODULE.search(module) \
                and shape[0] not in sizes:
            findings.append(make_finding(
                "CG304", m.source.info.file, f"{m.source.name} {list(shape)} disagrees with config.json: "
                                             f"no size of {architecture}'s config is {shape[0]}",
                tensor=m.source.name))
        if len(shape) == 2 and VOCAB_MODULE.search(module) and vocabs and shape[0] not in vocabs:
            findings.append(make_finding(
                "CG304", m.source.info.file, f"{m.source.name} {list(shape)} has {shape[0]} rows, but config.json's "
                                             f"vocab_size is {sorted(vocabs)[0]}", tensor=m.source.name))
    return findings + _check_layers(tensors)


def _check_layers(tensors: list[Mapped]) -> list[Finding]:
    """Blocks numbered 0..n-1, none lacking a tensor that a block after the first holds."""
    groups: dict[tuple[str, ...], dict[int, dict[tuple[str, ...], tuple[int, ...]]]] = {}
    files: dict[tuple[str, ...], str] = {}
    for m in tensors:
        parts = tuple(m.source.name.replace("/", ".").split("."))
        for i, part in enumerate(parts):
            if part.isdigit() and i > 0:
                groups.setdefault(parts[:i], {}).setdefault(int(part), {})[parts[i + 1:]] = m.source.info.shape
                files[parts[:i]] = m.source.info.file
                break
    findings = []
    for parent, members in groups.items():
        where = ".".join(parent)
        gaps = sorted(set(range(max(members) + 1)) - set(members))
        if gaps and parent[-1] in LAYER_LISTS:
            findings.append(make_finding("CG304", files[parent], f"{where}.{gaps[0]} is missing: {where} has "
                                                                 f"{len(members)} of {max(members) + 1} blocks"))
        if len(members) < 2 or parent[-1] not in ALIKE:
            continue
        union = {k for v in members.values() for k in v}
        for index, member in sorted(members.items()):
            for suffix in sorted(union - set(member)):
                # a tensor only the first block holds is normal (T5's relative_attention_bias, a ResNet
                # stage's shortcut); one a later block holds must be in every block
                if any(suffix in v for j, v in members.items() if j not in (0, index)):
                    name = ".".join((*parent, str(index), *suffix))
                    findings.append(make_finding("CG304", files[parent], f"{name} is missing: every other block of "
                                                                         f"{where} has it", tensor=name))
    return findings
