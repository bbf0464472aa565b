"""File names -> what they are: the matcher of the conventions table.

``classify`` reads a name alone (no I/O, no regular expression to compile on every
scan) against ``guard.inventory.conventions.CONVENTIONS``, first match wins; a name
no convention claims is a loose file of its own set.
"""

from __future__ import annotations

import functools
import posixpath

from guard.inventory.conventions import (
    CONVENTIONS,
    DTYPE_VARIANTS,
    EXTENSION_FORMATS,
    HF_EXTENSIONS,
    Convention,
    name_claimed_dtype,
)
from guard.records import Record

_PARSED = tuple((tuple(c.template.split(".")), c) for c in CONVENTIONS)
_SHARD_SUFFIX = len("-00001-of-00002")
_VARIANT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


class FileRole(Record):
    name: str  # the file's base name
    role: str
    kind: str
    layout: str  # "file" for names no convention claims
    stem: str
    format: str  # set format family; "" when unknown
    variant: str | None
    shard: tuple[int, int] | None  # (number, total)

    @property
    def variant_dtype(self) -> str | None:
        return DTYPE_VARIANTS.get(self.variant.lower()) if self.variant else None

    @property
    def set_key(self) -> tuple[str, str, str, str, str | None, bool]:
        """Files with the same key make one loadable copy."""
        return (self.role, self.layout, self.stem, self.format, self.variant, self.kind != "file")


def classify(path: str, *, weights: bool = False) -> FileRole:
    """What a file is, from its name alone (no I/O).  Unknown names are loose files of their own set.

    ``weights``: the file was read as weights, so it is never an index, whatever its name says.
    """
    return _classify_name(posixpath.basename(path), weights)


@functools.lru_cache(maxsize=1 << 14)  # discovery, the sets, the shard and variant rules all ask per file
def _classify_name(name: str, weights: bool) -> FileRole:
    at = name.find("-of-")
    if at >= 6 and name.find("-of-", at + 1) < 0:
        # One shard of many (``model-00007-of-04000.safetensors``): its role is its first shard's,
        # numbered.  The 4,000 shards of a sharded model share one classification, not 4,000.
        shard = _shard(name[at - 6:at + 9])
        if shard is not None:
            role = _classify(f"{name[:at - 6]}-00001-of-00001{name[at + 9:]}", weights)
            if role.shard is not None:  # the numbers were the shard's, not part of a stem
                # the record from its fields, not role._replace (a Python call with a dict of keywords): ~5 M
                # instructions less on a 1,000-shard scan (callgrind), once per shard name
                return _tuple_new(FileRole, (name, *role[1:7], shard))
    return _classify(name, weights)


_tuple_new = tuple.__new__


@functools.lru_cache(maxsize=1 << 10)  # the names' forms: a shard stands for all of its set's shards
def _classify(name: str, weights: bool) -> FileRole:
    parts = name.split(".")
    for template, conv in _PARSED:
        found = _match(template, parts, conv)
        if found is not None and not (weights and conv.kind == "index"):
            stem, ext, variant, shard = found
            return FileRole(name, conv.role, conv.kind, conv.layout, stem, EXTENSION_FORMATS.get(ext, ""), variant,
                            shard)
    return _loose(name, parts, indexes=not weights)


def convention_of(path: str) -> Convention | None:
    """The row of the table that claims a name, or None for a loose file."""
    parts = posixpath.basename(path).split(".")
    return next((conv for template, conv in _PARSED if _match(template, parts, conv) is not None), None)


def _match(template: tuple[str, ...], parts: list[str],
           conv: Convention) -> tuple[str, str, str | None, tuple[int, int] | None] | None:
    if template[0] == "{stem*}":
        if len(parts) < len(template) or not parts[0]:
            return None
        parts = [".".join(parts[: len(parts) - len(template) + 1]), *parts[len(parts) - len(template) + 1:]]
    elif len(parts) != len(template):
        return None
    stem = ext = ""
    variant: str | None = None
    shard: tuple[int, int] | None = None
    for want, got in zip(template, parts):
        if want in ("{stem}", "{stem*}"):
            stem = got
            if not _stem_ok(got, conv):
                return None
        elif want == "{ext}":
            ext = got
            if got not in conv.exts:
                return None
        elif want == "{variant}":
            variant = got
            if not _variant_ok(got):
                return None
        elif want == "{part}":
            if not (2 <= len(got) <= 3 and got.isdigit()):
                return None
        elif want.endswith("-{shard}"):
            shard = _shard(got[-_SHARD_SUFFIX:])
            head = got[:-_SHARD_SUFFIX]
            if shard is None:
                return None
            if want == "{stem}-{shard}":
                stem = head
                if not _stem_ok(head, conv):
                    return None
            else:
                variant = head
                if not _variant_ok(head):
                    return None
        elif want != got:
            return None
    return stem, ext, variant, shard


def _stem_ok(stem: str, conv: Convention) -> bool:
    if conv.stems is None:
        return 0 < len(stem) <= 200
    if stem in conv.stems:
        return True
    base, _, number = stem.rpartition("_")
    return conv.numbered and base in conv.stems and 1 <= len(number) <= 6 and number.isdigit()


def _variant_ok(variant: str) -> bool:
    """One dotted component, bounded, never a shard number: hostile names stay loose files."""
    return (0 < len(variant) <= 64 and variant[0].isalnum() and variant.isascii() and set(variant) <= _VARIANT_CHARS
            and not _has_shard(variant))


def _has_shard(text: str) -> bool:
    return any(_shard_shaped(text[i:i + _SHARD_SUFFIX]) for i, ch in enumerate(text) if ch == "-")


def _shard_shaped(text: str) -> bool:
    """``-DDDDD-of-DDDDD``, whatever the numbers."""
    return (len(text) == _SHARD_SUFFIX and text[0] == "-" and text[6:10] == "-of-" and text[1:6].isdigit()
            and text[10:].isdigit() and text.isascii())


def _shard(text: str) -> tuple[int, int] | None:
    """``-00001-of-00003`` -> (1, 3); None for anything else, ``-00000-of-...`` and ``k > n`` included."""
    if not _shard_shaped(text):
        return None
    k, n = int(text[1:6]), int(text[10:])
    return (k, n) if 1 <= k <= n else None


def _loose(name: str, parts: list[str], *, indexes: bool) -> FileRole:
    if indexes and len(parts) >= 4 and parts[-2:] == ["index", "json"] and parts[-3] in HF_EXTENSIONS and parts[0]:
        stem = ".".join(parts[:-3])
        if len(stem) <= 200:
            return FileRole(name, "weights", "index", "file", stem, EXTENSION_FORMATS[parts[-3]], None, None)
    ext = parts[-1].lower() if len(parts) > 1 else ""
    stem = name[: -len(ext) - 1] if ext else name
    shard = _shard(stem[-_SHARD_SUFFIX:]) if len(stem) > _SHARD_SUFFIX else None
    if shard is not None and len(ext) <= 12:
        return FileRole(name, "weights", "shard", "file", stem[:-_SHARD_SUFFIX], EXTENSION_FORMATS.get(ext, ""), None,
                        shard)
    return FileRole(name, "weights", "file", "file", stem, EXTENSION_FORMATS.get(ext, ""), None, None)


def index_target(path: str) -> FileRole | None:
    """The set an index file describes (its shards' key), or None when it is not an index."""
    role = classify(path)
    return role if role.kind == "index" else None


def claimed_dtype(role: FileRole) -> str | None:
    """The dtype a file's name claims: a dtype variant, or a dtype word in a loose name."""
    if role.variant_dtype:
        return role.variant_dtype
    if role.layout != "file":
        return None
    return name_claimed_dtype(role.name)
