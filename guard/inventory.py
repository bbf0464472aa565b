"""ModelInventory: one model directory's weight files, shard indexes and config.json."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from guard import dtypes
from guard.catalogue import make_finding
from guard.errors import UsageError
from guard.findings import Finding
from guard.readers import WEIGHT_SUFFIXES, scan_file, unreadable
from guard.sources import BytesSource, LocalFile
from guard.tensors import FileScan, TensorInfo

INDEX_SUFFIX = ".index.json"
CONFIG_NAME = "config.json"
SKIP_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".cache"}
MAX_JSON_BYTES = 64 * 1024 * 1024  # index/config files are small; refuse to slurp a huge one


def is_weight_file(name: str) -> bool:
    return name.lower().endswith(WEIGHT_SUFFIXES)


def is_index_file(name: str) -> bool:
    return name.endswith(INDEX_SUFFIX) and is_weight_file(name[: -len(INDEX_SUFFIX)])


@dataclass(frozen=True)
class DtypeStats:
    tensors: int = 0
    parameters: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class ConfigDtype:
    key: str  # "torch_dtype", "text_config.dtype", ...
    value: str
    line: int | None


@dataclass
class ShardIndex:
    path: str
    weight_map: dict[str, str] = field(default_factory=dict)  # tensor -> shard file name
    text: str = ""


@dataclass
class ModelInventory:
    path: str  # the model directory, as displayed
    files: list[FileScan] = field(default_factory=list)
    indexes: list[ShardIndex] = field(default_factory=list)
    config_path: str | None = None
    config: dict[str, object] | None = None
    config_text: str = ""
    findings: list[Finding] = field(default_factory=list)  # inventory-level (bad JSON, ...)

    @property
    def tensors(self) -> Iterator[TensorInfo]:
        for scan in self.files:
            yield from scan.tensors

    def file_findings(self) -> Iterator[Finding]:
        for scan in self.files:
            yield from scan.findings
        yield from self.findings

    def dtype_summary(self) -> dict[str, DtypeStats]:
        stats: dict[str, list[int]] = {}
        for tensor in self.tensors:
            row = stats.setdefault(tensor.dtype, [0, 0, 0])
            row[0] += 1
            row[1] += tensor.numel
            row[2] += tensor.nbytes or 0
        order = sorted(stats, key=lambda code: -stats[code][1])
        return {code: DtypeStats(*stats[code]) for code in order}

    def config_dtypes(self) -> list[ConfigDtype]:
        if not isinstance(self.config, dict):
            return []
        found: list[ConfigDtype] = []
        _collect_config_dtypes(self.config, "", found, depth=0)
        return [
            ConfigDtype(item.key, item.value, _line_of(self.config_text, item.key.rsplit(".", 1)[-1],
                                                      item.value))
            for item in found
        ]

    def quantization(self) -> str | None:
        """A short description if the model is quantized (reported as such, not as errors)."""
        if isinstance(self.config, dict) and isinstance(self.config.get("quantization_config"), dict):
            method = self.config["quantization_config"].get("quant_method", "quantized")
            return str(method)
        codes = {t.dtype for t in self.tensors}
        low = sorted(codes & dtypes.QUANTIZED_CODES)
        if low:
            return "+".join(dtypes.display_name(c) for c in low)
        return None


def _collect_config_dtypes(obj: dict[str, object], prefix: str, out: list[ConfigDtype], *, depth: int) -> None:
    if depth > 8:
        return
    for key, value in obj.items():
        if key in ("torch_dtype", "dtype") and isinstance(value, str):
            out.append(ConfigDtype(prefix + key, value, None))
        elif isinstance(value, dict) and key != "quantization_config":
            _collect_config_dtypes(value, f"{prefix}{key}.", out, depth=depth + 1)


def _line_of(text: str, key: str, value: str | None = None) -> int | None:
    """1-based line of ``"key"`` (optionally followed by the value) in a JSON text."""
    pattern = re.escape(json.dumps(key)) + r"\s*:"
    if value is not None:
        pattern += r"\s*" + re.escape(json.dumps(value))
    match = re.search(pattern, text)
    if match is None:
        return None
    return text.count("\n", 0, match.start()) + 1


def line_in_json(text: str, key: str) -> int | None:
    return _line_of(text, key)


# ---------------------------------------------------------------- building


def build_inventory(
    path: str,
    weight_scans: Iterable[FileScan],
    *,
    json_files: Mapping[str, bytes | None],
) -> ModelInventory:
    """Assemble an inventory from already-read weight files and small JSON files.

    ``json_files`` maps display paths of index files and config.json to their
    bytes (None where the file could not be read).  Local and Hub scans share this.
    """
    inv = ModelInventory(path=path, files=sorted(weight_scans, key=lambda s: s.path))
    for name, data in sorted(json_files.items()):
        base = os.path.basename(name)
        parsed, text = _parse_json(name, data, inv.findings)
        if base == CONFIG_NAME:
            inv.config_path = name
            inv.config_text = text
            if parsed is not None and not isinstance(parsed, dict):
                inv.findings.append(make_finding("CG001", name, "config.json is not a JSON object"))
            elif parsed is not None:
                inv.config = parsed
        elif is_index_file(base) and parsed is not None:
            index = ShardIndex(name, text=text)
            weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
            if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
            ):
                inv.findings.append(make_finding(
                    "CG004", name, "shard index has no valid \"weight_map\" (tensor name -> shard file)"))
            else:
                index.weight_map = weight_map
            inv.indexes.append(index)
    return inv


def _parse_json(name: str, data: bytes | None, findings: list[Finding]) -> tuple[object | None, str]:
    if data is None:
        findings.append(make_finding("CG001", name, "file could not be read"))
        return None, ""
    try:
        text = data.decode("utf-8")
        return json.loads(text), text
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        findings.append(make_finding("CG001", name, f"not valid JSON: {reason}"))
        return None, ""


# ---------------------------------------------------------------- local discovery


@dataclass(frozen=True)
class LocalModel:
    directory: Path
    weight_files: tuple[Path, ...]
    json_files: tuple[Path, ...]
    orbax: tuple[Path, ...] = ()  # readers-b: Orbax checkpoint directories (see the Orbax hook below)


def display_path(path: Path) -> str:
    """Relative to the working directory when inside it, POSIX separators."""
    try:
        rel = path.resolve().relative_to(Path.cwd().resolve())
        return rel.as_posix() or "."
    except ValueError:
        return path.as_posix()


def discover_models(paths: Iterable[str | os.PathLike[str]]) -> list[LocalModel]:
    """Every model directory under the given files and directories.

    A file stands for the model of its directory (pre-commit passes subsets of
    shards; the siblings are read from disk).  A path that does not exist is a
    UsageError (exit 2).
    """
    directories: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists() and not path.is_symlink():
            raise UsageError(f"{os.fspath(raw)}: no such file or directory")
        if path.is_dir():
            for directory in _walk(path):
                directories.setdefault(directory, None)
        else:
            directories.setdefault(path.parent, None)
    models = []
    for directory in directories:
        model = _local_model(directory)
        if model.weight_files or model.orbax or any(is_index_file(p.name) for p in model.json_files):
            models.append(model)
    return drop_inside_orbax(models)


def _walk(root: Path) -> Iterator[Path]:
    for current, dirnames, _files in os.walk(root, onerror=_raise_unreadable):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        yield Path(current)


def _raise_unreadable(exc: OSError) -> None:
    raise UsageError(f"{exc.filename}: cannot read directory ({exc.strerror})")


def _local_model(directory: Path) -> LocalModel:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"{display_path(directory)}: cannot read directory ({exc.strerror})") from None
    weights, jsons = [], []
    for entry in entries:
        if not entry.is_file():
            continue
        if is_weight_file(entry.name):
            weights.append(Path(entry.path))
        elif entry.name == CONFIG_NAME or is_index_file(entry.name):
            jsons.append(Path(entry.path))
    return LocalModel(directory, tuple(weights), tuple(jsons), local_orbax(directory, entries))


def load_local_model(model: LocalModel) -> ModelInventory:
    scans = [scan_local_file(p) for p in model.weight_files] + [scan_local_orbax(d) for d in model.orbax]
    json_files = {display_path(p): read_small_file(p) for p in model.json_files}
    return build_inventory(display_path(model.directory), scans, json_files=json_files)


def scan_local_file(path: Path) -> FileScan:
    name = display_path(path)
    try:
        source = LocalFile(path, name=name)
    except OSError as exc:
        return unreadable(BytesSource(b"", name=name), f"cannot open file ({exc.strerror})")
    with source:
        try:
            return scan_file(source)
        except OSError as exc:
            return unreadable(source, f"read failed ({exc.strerror})")


def read_small_file(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_JSON_BYTES + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_JSON_BYTES else b"\xff"  # oversized -> reported as invalid JSON


# ---------------------------------------------------------------- Orbax hook (readers-b)
# An Orbax checkpoint is a directory, read as one FileScan.  Until weight sets (issue 9) take this
# over, a directory holding _METADATA (StandardCheckpointer) or _CHECKPOINT_METADATA plus items
# (a CheckpointManager step) is a model of its own, and the directories inside it are not.

MAX_ORBAX_FILES = 200_000


def local_orbax(directory: Path, entries: list[os.DirEntry[str]]) -> tuple[Path, ...]:
    from guard.readers.orbax import CHECKPOINT_METADATA, METADATA

    names = {e.name for e in entries}
    if METADATA in names or (CHECKPOINT_METADATA in names and any(
            e.is_dir(follow_symlinks=False) and os.path.isfile(os.path.join(e.path, METADATA)) for e in entries)):
        return (directory,)
    return ()


def drop_inside_orbax(models: list[LocalModel]) -> list[LocalModel]:
    roots = [m.directory for m in models if m.orbax]
    return [m for m in models if not any(r in m.directory.parents for r in roots)]


def orbax_files(directory: Path) -> dict[str, int]:
    """Relative POSIX path -> size of every file under an Orbax checkpoint (symlinks not followed)."""
    files: dict[str, int] = {}
    for current, dirnames, names in os.walk(directory):
        dirnames.sort()
        for name in sorted(names):
            path = Path(current, name)
            if path.is_symlink() or not path.is_file():
                continue
            files[path.relative_to(directory).as_posix()] = path.stat().st_size
            if len(files) > MAX_ORBAX_FILES:
                return files
    return files


def scan_local_orbax(directory: Path) -> FileScan:
    from guard.readers.orbax import is_orbax_checkpoint, read_orbax_checkpoint

    name = display_path(directory)
    files = orbax_files(directory)
    if len(files) > MAX_ORBAX_FILES:
        return unreadable(BytesSource(b"", name=name), f"more than {MAX_ORBAX_FILES:,} files in the checkpoint")
    if not is_orbax_checkpoint(files):
        return unreadable(BytesSource(b"", name=name), "no _METADATA in the Orbax checkpoint")

    def open_file(relative: str) -> LocalFile:
        if relative not in files:  # the reader only opens listed files; refuse anything else
            raise KeyError(relative)
        return LocalFile(directory / relative, name=f"{name}/{relative}")

    try:
        return read_orbax_checkpoint(name, files, open_file, local_root=str(directory.resolve()))
    except OSError as exc:
        return unreadable(BytesSource(b"", name=name), f"read failed ({exc.strerror})")
