"""Tied and shared storages, settled the way transformers' ``save_pretrained(safe_serialization=True)`` does.

A torch pickle may give one storage several names; safetensors gives every name bytes of
its own.  Within one storage of one file:

- names on exactly the same bytes (same span, dtype, shape and stride) are one tensor, *tied*:
  one name is kept and the others dropped.  The dropped ones are those the model class declares
  tied (``_tied_weights_keys``: ``from_pretrained`` ties them back), the class attribute of
  config.json's ``architectures`` read from the installed transformers' source (nothing imported
  or instantiated), else ``USUAL_TIED_NAMES``.  Where no name is declared, the first in sorted
  order is kept (safetensors' ``_remove_duplicate_names``).
- names on disjoint bytes are written as separate copies (transformers clones them);
- names whose bytes overlap otherwise are refused: no safetensors file can hold them as one
  tensor or as two (transformers raises too).
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Sequence
from pathlib import Path

from guard.errors import GuardError
from guard.findings import shown
from guard.records import Record
from guard.tensors import TensorInfo

_MODEL_TYPE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# Output layers that transformers' model classes tie to their input embeddings (regexes, searched,
# as ``_tied_weights_keys`` entries are): used where the model class cannot be looked up.
USUAL_TIED_NAMES: tuple[str, ...] = (
    r"lm_head\.weight",  # GPT-2, Llama (tie_word_embeddings), T5, BART, ...
    r"lm_head\.decoder\.(weight|bias)",  # RoBERTa, XLM-R, CamemBERT
    r"predictions\.decoder\.(weight|bias)",  # BERT, ALBERT, Electra generator heads (cls.predictions...)
    r"generator_lm_head\.weight",  # Electra
    r"(encoder|decoder)\.embed_tokens\.weight",  # encoder-decoders that keep `shared.weight`
    r"output_projection\.weight",  # fairseq-style heads
)


class Tie(Record):
    kept: str
    dropped: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"kept": self.kept, "dropped": list(self.dropped)}


class Settled(Record):
    tensors: list[TensorInfo]  # what to write, in source order (a tie at its first name's place)
    ties: list[Tie]
    patterns_from: str  # where the declared tied names came from


def settle_shared(tensors: Sequence[TensorInfo], config: object) -> Settled:
    """The tensors a safetensors copy holds: ties collapsed, disjoint views kept, overlaps refused."""
    groups: dict[tuple[str, str], list[TensorInfo]] = {}
    for info in tensors:
        if info.storage is not None and info.data_start is not None and info.data_end is not None:
            groups.setdefault((info.file, info.storage), []).append(info)
    shared = [group for group in groups.values() if len(group) > 1]
    if not shared:
        return Settled(list(tensors), [], "")
    patterns, source = declared_tied_names(config)
    tied: set[str] = set()  # every name of a tie: the kept one is written at the place of the first
    kept_at: dict[str, str] = {}  # the first name of a tie -> the name kept for it
    ties: list[Tie] = []
    for group in shared:
        for cluster in _overlapping(group):
            if len(cluster) < 2:
                continue
            first = cluster[0]
            key = _identity(first)
            other = next((t for t in cluster if _identity(t) != key), None)
            if other is not None:
                raise GuardError(
                    f"{posixpath.basename(first.file)}: {shown(first.name)} and {shown(other.name)} share bytes of "
                    "one storage but are not the same tensor (overlapping views); a safetensors file cannot hold "
                    "them, and transformers' save_pretrained refuses them too: nothing written")
            names = [t.name for t in cluster]
            keep = _kept(names, patterns)
            ties.append(Tie(keep, tuple(sorted(n for n in names if n != keep))))
            tied.update(names)
            kept_at[first.name] = keep
    by_name = {t.name: t for t in tensors}
    out: list[TensorInfo] = []
    for info in tensors:
        if info.name in kept_at:
            out.append(by_name[kept_at[info.name]])
        elif info.name not in tied:
            out.append(info)
    return Settled(out, ties, source)


def _identity(info: TensorInfo) -> tuple[object, ...]:
    return (info.data_start, info.data_end, info.dtype, info.shape, info.stride)


def _area(info: TensorInfo) -> tuple[int, int]:
    assert info.data_start is not None and info.data_end is not None
    return info.data_start, info.data_end


def _overlapping(group: list[TensorInfo]) -> list[list[TensorInfo]]:
    """Clusters of names whose byte spans overlap, in source order; an empty tensor overlaps nothing."""
    spans = {i: _area(t) for i, t in enumerate(group)}
    clusters = [[i] for i, (start, end) in spans.items() if end <= start]
    current: list[int] | None = None
    stop = 0
    for i in sorted((i for i, (start, end) in spans.items() if end > start), key=lambda i: (spans[i], i)):
        start, end = spans[i]
        if current is not None and start < stop:
            current.append(i)
            stop = max(stop, end)
        else:
            current, stop = [i], end
            clusters.append(current)
    return [[group[i] for i in sorted(cluster)] for cluster in clusters]


def _kept(names: list[str], patterns: Sequence[str]) -> str:
    """transformers drops the declared names (all but the last, sorted, when every name is declared)."""
    declared = [n for n in sorted(names) if any(re.search(p, n) for p in patterns)]
    undeclared = [n for n in sorted(names) if n not in declared]
    return undeclared[0] if undeclared else declared[-1]


def declared_tied_names(config: object) -> tuple[tuple[str, ...], str]:
    """The tied-name patterns of the model class config.json names, and where they came from."""
    architectures = config.get("architectures") if isinstance(config, dict) else None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if isinstance(architectures, list) and isinstance(model_type, str):
        for name in architectures:
            keys = transformers_tied_keys(name, model_type)
            if keys:
                return keys, f"{name}._tied_weights_keys"
    return USUAL_TIED_NAMES, "the usual tied output names"


def transformers_tied_keys(name: object, model_type: str) -> tuple[str, ...] | None:
    """``_tied_weights_keys`` of transformers' class ``name``, read from its source as a literal.

    Nothing is imported or instantiated: importing a modeling module costs seconds (torch,
    and whatever else transformers pulls in), and config.json is the checkpoint's own text,
    so it only ever selects a file inside the installed transformers, by a plain name.
    """
    import importlib.util

    if not (isinstance(name, str) and name.isidentifier() and _MODEL_TYPE.fullmatch(model_type)):
        return None
    spec = importlib.util.find_spec("transformers")  # finds the package; does not import it
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = model_type.replace("-", "_")
    path = Path(spec.submodule_search_locations[0]) / "models" / folder / f"modeling_{folder}.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    return _class_attribute(classes, name, depth=0)


def _class_attribute(classes: dict[str, ast.ClassDef], name: str, *, depth: int) -> tuple[str, ...] | None:
    """The literal ``_tied_weights_keys`` in the class body, else in its bases defined in the same module."""
    node = classes.get(name)
    if node is None or depth > 8:
        return None
    for item in node.body:
        targets = item.targets if isinstance(item, ast.Assign) else [item.target] \
            if isinstance(item, ast.AnnAssign) and item.value is not None else []
        if any(isinstance(t, ast.Name) and t.id == "_tied_weights_keys" for t in targets):
            try:
                value = ast.literal_eval(item.value)  # type: ignore[attr-defined]  # an (Ann)Assign
            except ValueError:  # computed, not a literal: the usual names stand in
                return None
            if isinstance(value, dict):  # transformers 5: {tied name: source name}
                value = list(value)
            if isinstance(value, (list, tuple)) and all(isinstance(k, str) for k in value):
                return tuple(value)
            return ()  # None: declares no tied names
    for base in node.bases:
        if isinstance(base, ast.Name):
            found = _class_attribute(classes, base.id, depth=depth + 1)
            if found is not None:
                return found
    return None
