"""Policy: what a scan expects.  From pyproject.toml / .ckpt-guard.toml; CLI flags win."""

from __future__ import annotations

import functools
import itertools
import operator
import os
import re
import sys

from guard import dtypes
from guard.catalogue import RULES_BY_CODE
from guard.errors import ConfigError
from guard.findings import FAIL_ON_CHOICES
from guard.records import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (~3 ms, the hook's path)
if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable
    from typing import Any

EXPECT_MODES = ("uniform", "config")
DEFAULT_KEEP_FP32 = ("*norm*", "*ln_*")  # layer/RMS norms (LayerNorm, layer_norm, ln_f, ln_1, ...)
NORM_PATTERNS = DEFAULT_KEEP_FP32
TARGET_FRAMEWORKS = ("torch", "flax", "jax", "numpy")
CONFIG_FILES = (".ckpt-guard.toml", "pyproject.toml")


class Target(Record):
    framework: str  # torch | flax | jax | numpy
    dtype: str | None = None  # a cast target such as F16 (torch:fp16)

    def __str__(self) -> str:
        return self.framework + (f":{dtypes.display_name(self.dtype)}" if self.dtype else "")


class Policy(Record):
    expect: str = "F32"  # a dtype code, "uniform" or "config"
    keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32
    targets: tuple[Target, ...] = (Target("torch"), Target("flax"))
    select: tuple[str, ...] = ("CG",)
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    fail_on: str = "error"
    source: str | None = None  # the config file it came from

    def keeps_fp32(self, tensor: str) -> bool:
        return fp32_keeper(self.keep_fp32)(tensor)

    def is_enabled(self, code: str, path: str | None = None) -> bool:
        """Longest matching prefix wins between select/extend-select and ignore."""
        if path is None or not self.per_file_ignores:  # the path cannot matter: one answer per code
            return _code_enabled(self.select + self.extend_select, self.ignore, code)
        best_select = max((len(p) for p in self.select + self.extend_select if code.startswith(p)), default=-1)
        ignores = list(self.ignore)
        if path is not None:
            for pattern, codes in self.per_file_ignores:
                from fnmatch import fnmatch  # only where per-file-ignores are configured

                if fnmatch(path, pattern) or fnmatch(os.path.basename(path), pattern):
                    ignores.extend(codes)
        best_ignore = max((len(p) for p in ignores if code.startswith(p)), default=-1)
        return best_select > best_ignore

    def to_json(self) -> dict[str, Any]:
        return {
            "expect": self.expect if self.expect in EXPECT_MODES else dtypes.display_name(self.expect),
            "keep_fp32": list(self.keep_fp32),
            "targets": [str(t) for t in self.targets],
            "select": list(self.select),
            "extend_select": list(self.extend_select),
            "ignore": list(self.ignore),
            "per_file_ignores": {p: list(c) for p, c in self.per_file_ignores},
            "fail_on": self.fail_on,
            "config_file": self.source,
        }


@functools.lru_cache(maxsize=256)
def _code_enabled(select: tuple[str, ...], ignore: tuple[str, ...], code: str) -> bool:
    """``Policy.is_enabled`` without per-file ignores: asked for every finding and every check, per code."""
    best_select = max((len(p) for p in select if code.startswith(p)), default=-1)
    return best_select > max((len(p) for p in ignore if code.startswith(p)), default=-1)


@functools.lru_cache(maxsize=32)
def _any_glob(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One regex for a tuple of case-insensitive globs: tested once per tensor, not once per pattern."""
    from fnmatch import translate  # only for globs that are not all ``*word*`` (the defaults are)

    return re.compile("|".join(f"(?:{translate(p.lower())})" for p in patterns) or "(?!)")


@functools.lru_cache(maxsize=32)
def fp32_keeper(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a tensor name matches one of the globs, remembered per name.

    Rules ask per tensor, and the copies and variants of one model, or the components of a
    pipeline, repeat the same names: each distinct name is matched once per run.
    """
    words = _containment(patterns)
    if words is not None:  # every glob is ``*word*``: a substring test per word, no regex, no memo
        def contains(name: str) -> bool:
            low = name.lower()
            for word in words:
                if word in low:
                    return True
            return False

        return contains
    match = _any_glob(patterns).match
    seen: dict[str, bool] = {}

    def matches(name: str) -> bool:
        hit = seen.get(name)
        if hit is None:
            if len(seen) >= _KEEPER_NAMES:  # bounded: a hostile file's millions of names
                seen.clear()
            hit = seen[name] = match(name.lower()) is not None
        return hit

    return matches


_KEEPER_NAMES = 1 << 16


def match_flags(patterns: tuple[str, ...], names: list[str]) -> list[bool]:
    """Whether each of ``names`` matches the globs, as ``fp32_keeper`` matches.

    For ``*word*`` globs (the defaults) every test runs in C (``map`` over the lowercased names, one
    substring test per word): a rule that asks this of a 200,000-tensor sharded model, or of a
    pipeline commit's 4,800 tensors, makes no Python call per name.
    """
    words = _containment(patterns)
    if words is None:
        return list(map(fp32_keeper(patterns), names))
    flags: list[bool] = []
    for start in range(0, len(names), _LOWERED):  # a slice at a time: 200,000 lowered copies at once were 20 MB
        lowered = list(map(str.lower, names[start:start + _LOWERED]))
        hits = map(operator.contains, lowered, itertools.repeat(words[0]))
        for word in words[1:]:
            hits = map(operator.or_, hits, map(operator.contains, lowered, itertools.repeat(word)))
        flags += hits
    return flags


_LOWERED = 8192


@functools.lru_cache(maxsize=32)
def _containment(patterns: tuple[str, ...]) -> tuple[str, ...] | None:
    """The words of globs that are all ``*word*`` (the defaults, ``*norm*`` and ``*ln_*``), lowercased, or None.

    ``fnmatch`` reads ``*word*`` as "word anywhere in the name" (``*`` takes any characters, newlines
    included), so a case-insensitive match is ``word in name.lower()``: 200,000 tensors of a sharded
    model cost one ``lower()`` and a substring search each instead of a regex match.
    """
    words = []
    for pattern in patterns:
        word = pattern[1:-1]
        if len(pattern) < 3 or pattern[0] != "*" or pattern[-1] != "*" or any(c in word for c in "*?[]"):
            return None
        words.append(word.lower())
    return tuple(words) if words else None


def parse_expect(value: str) -> str:
    if value in EXPECT_MODES:
        return value
    code = dtypes.parse_dtype_name(value)
    if code is None or not dtypes.is_float(code):
        raise ConfigError(f"expect: {value!r} is not fp32, bf16, fp16, uniform or config")
    return code


def parse_target(value: str) -> Target:
    framework, _, dtype = value.partition(":")
    framework = framework.strip().lower()
    if framework not in TARGET_FRAMEWORKS:
        raise ConfigError(f"target: {value!r}: framework must be one of {', '.join(TARGET_FRAMEWORKS)}")
    code = None
    if dtype:
        code = dtypes.parse_dtype_name(dtype)
        if code is None:
            raise ConfigError(f"target: {value!r}: unknown dtype {dtype!r}")
    return Target(framework, code)


def parse_codes(values: list[str] | tuple[str, ...], *, key: str) -> tuple[str, ...]:
    out: list[str] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip().upper()
            if not part:
                continue
            if part == "ALL":
                part = "CG"
            if not part.startswith("CG") or not any(code.startswith(part) for code in RULES_BY_CODE):
                raise ConfigError(f"{key}: {part!r} matches no rule code")
            out.append(part)
    return tuple(out)


def parse_fail_on(value: str) -> str:
    if value not in FAIL_ON_CHOICES:
        raise ConfigError(f"fail-on: {value!r} is not one of {', '.join(FAIL_ON_CHOICES)}")
    return value


# ---------------------------------------------------------------- files

_KEYS = {"expect", "keep-fp32", "targets", "select", "extend-select", "ignore", "per-file-ignores", "fail-on"}


def find_config_file(start: str | os.PathLike[str] | None = None) -> str | None:
    """The nearest .ckpt-guard.toml, or pyproject.toml with [tool.ckpt-guard], upwards from start."""
    directory = os.path.realpath(start if start is not None else os.getcwd())
    while True:
        for name in CONFIG_FILES:
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate) and (name != "pyproject.toml" or _has_tool_table(candidate)):
                return candidate
        parent = os.path.dirname(directory)
        if parent == directory or os.path.exists(os.path.join(directory, ".git")):
            return None
        directory = parent


def _has_tool_table(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            text = fh.read()
        # Most pyproject.toml files: no TOML parser needed.  The table is ``tool.ckpt-guard`` (a table
        # header or a dotted key, quoted or not), or a key ``ckpt-guard`` under a ``[tool]`` table or in an
        # inline ``tool = {...}``; the word alone (a dependency, a script, the project's own name) is not.
        if b"ckpt-guard" not in text or not (
                re.search(rb"""tool[ \t]*\.[ \t]*["']?ckpt-guard""", text)
                or (re.search(rb"""^[ \t]*\[[ \t]*tool[ \t]*\]|\btool[ \t]*=[ \t]*\{""", text, re.MULTILINE)
                    and re.search(rb"""ckpt-guard["']?[ \t]*[.=]""", text))):
            return False
        return "ckpt-guard" in _load_toml(path).get("tool", {})
    except (ConfigError, OSError):
        return False


def _load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None


def load_config(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The raw [tool.ckpt-guard] table (or a .ckpt-guard.toml's top level), keys normalised."""
    if path is None:
        return {}
    data = _load_toml(path)
    if os.path.basename(path) == "pyproject.toml" or "tool" in data:
        data = data.get("tool", {}).get("ckpt-guard", {})
    table = {key.replace("_", "-"): value for key, value in data.items()}
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
    return table


def build_policy(
    table: dict[str, Any], *, source: str | None = None, overrides: dict[str, Any] | None = None
) -> Policy:
    """Policy from a config table, then CLI overrides (None / empty = not given)."""
    merged = dict(table)
    for key, value in (overrides or {}).items():
        if value is not None and value != ():
            merged[key] = value
    policy = Policy(source=source)
    try:
        if "expect" in merged:
            policy = policy._replace(expect=parse_expect(str(merged["expect"])))
        if "keep-fp32" in merged:
            extra = tuple(str(p) for p in _as_list(merged["keep-fp32"], "keep-fp32"))
            policy = policy._replace(keep_fp32=DEFAULT_KEEP_FP32 + extra)
        if "targets" in merged:
            targets = tuple(parse_target(str(t)) for t in _as_list(merged["targets"], "targets"))
            policy = policy._replace(targets=targets)
        for key in ("select", "extend-select", "ignore"):
            if key in merged:
                codes = parse_codes(_as_list(merged[key], key), key=key)
                policy = policy._replace(**{key.replace("-", "_"): codes})  # type: ignore[arg-type]  # key is one of select, extend_select, ignore: tuple[str, ...] fields
        if "per-file-ignores" in merged:
            value = merged["per-file-ignores"]
            if not isinstance(value, dict):
                raise ConfigError("per-file-ignores: expected a table of glob = [codes]")
            pairs = tuple(
                (str(glob), parse_codes(_as_list(codes, "per-file-ignores"), key="per-file-ignores"))
                for glob, codes in value.items()
            )
            policy = policy._replace(per_file_ignores=pairs)
        if "fail-on" in merged:
            policy = policy._replace(fail_on=parse_fail_on(str(merged["fail-on"])))
    except TypeError as exc:  # wrong TOML types
        raise ConfigError(f"{source or 'config'}: {exc}") from None
    return policy


def _as_list(value: Any, key: str) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return list(value)
    raise ConfigError(f"{key}: expected a string or a list of strings, got {type(value).__name__}")
