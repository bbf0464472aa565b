"""Local discovery: paths -> model directories -> inventories, reading headers only."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator

import guard.inventory.tf_dirs as tf_dirs  # the module itself: `from guard.inventory` would be a cycle with __init__
from guard.catalogue import make_finding
from guard.collector import settle
from guard.errors import UsageError
from guard.inventory.conventions import UNSUPPORTED_SUFFIXES
from guard.inventory.model import (
    CONFIG_NAME,
    MAX_JSON_BYTES,
    PIPELINE_INDEX,
    TOKEN_FILES,
    TOKENIZER,
    ModelInventory,
    build_inventory,
    is_index_file,
    is_weight_file,
)
from guard.inventory.package_dirs import enclosing_package, is_package, local_weights, scan_local_package
from guard.inventory.quant_conventions import QUANT_CONFIG_FILES  # quanto_qmap.json, quantize_config.json
from guard.paths import clean_path, path_name, path_parent
from guard.readers import READ_FAILURES, scan_file, sniff_format, unreadable
from guard.records import Record
from guard.sources import ByteSource, BytesSource, LocalFile
from guard.tensors import FileScan
from guard.training.registry import has_training_marker  # the trainers' marker names (their code: lazily)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (the hook's path)
if TYPE_CHECKING:
    from guard.training.dirs import TrainingDir  # the trainers' code, imported only where a marker is

SKIP_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".cache"}
FIX_STAGING_PREFIX = ".ckpt-guard-fix-"  # guard.fix.apply's staging directories: half-written, never scanned
# Files without a weight suffix are sniffed by magic bytes when at least this large (a weight file
# renamed, or a format whose name says nothing); small text files never cost a read.
SNIFF_MIN_BYTES = 64 * 1024
_NOT_WEIGHTS = frozenset({
    "json", "txt", "md", "py", "yaml", "yml", "toml", "cfg", "ini", "model", "vocab", "tiktoken", "png",
    "jpg", "jpeg", "gif", "webp", "svg", "wav", "mp3", "flac", "csv", "tsv", "parquet", "arrow", "jsonl",
    "gitattributes", "gitignore", "html", "ipynb", "sh", "lock", "zip", "tar", "gz", "xz", "bz2", "zst",
    "pdf", "mp4", "webm", "mov", "ttf", "otf", "woff", "woff2",
    "data", "onnx_data",  # external data of an ONNX model: raw bytes its model file places and checks
    "xml",  # an OpenVINO IR is found by its pair (guard.inventory.package_dirs), never sniffed
    "orig",  # NAME.orig: the file a `fix --replace` replaced, kept as a backup; not one of the model's sets
    # source, build and documentation files of a repository the hook runs in: never stat'ed or opened
    "c", "h", "cc", "cpp", "cxx", "hpp", "hh", "cu", "cuh", "m", "mm", "swift", "java", "kt", "scala", "go", "rs",
    "rb", "php", "pl", "lua", "r", "jl", "js", "mjs", "cjs", "ts", "tsx", "jsx", "vue", "css", "scss", "less", "map",
    "pyi", "pyx", "pxd", "pyc", "pyo", "proto", "cmake", "mk", "bat", "ps1", "rst", "tex", "bib", "log", "ico",
    "bmp", "tif", "tiff", "env", "editorconfig", "dockerignore", "gitmodules", "typed", "sum", "mod",
})
_WEIGHT_MAGIC = (b"GGUF", b"\x89HDF\r\n\x1a\n", b"\x93NUMPY", bytes.fromhex("80028a0a6cfc9c46f9206aa850192e"))


class LocalModel(Record):
    directory: str
    weight_files: tuple[str, ...]
    json_files: tuple[str, ...]
    orbax: tuple[str, ...] = ()  # Orbax checkpoint directories (guard.inventory.orbax_dirs)
    training: tuple[TrainingDir, ...] = ()  # training checkpoints here


def display_path(path: str | os.PathLike[str]) -> str:
    """Relative to the working directory when inside it, POSIX separators.

    The directory is resolved, the name is not: a file that is a symlink (every file of a
    Hugging Face cache snapshot points into ``blobs/``) keeps the name its conventions read.
    """
    text = clean_path(path)
    name = path_name(text)
    if name in ("", ".", ".."):
        return _display_dir(text, os.getcwd())
    parent = _display_dir(path_parent(text), os.getcwd())
    return name if parent == "." else f"{parent.rstrip('/')}/{name}"


@functools.lru_cache(maxsize=4096)
def _display_dir(directory: str, cwd: str) -> str:
    real, base = _real(directory), _real(cwd)
    if real == base:
        return "."
    prefix = base.rstrip("/") + "/"
    return real[len(prefix):] if real.startswith(prefix) else directory


@functools.lru_cache(maxsize=4096)
def _real(directory: str) -> str:
    """``os.path.realpath`` (what ``Path.resolve`` does), built on the parent's: a folder that is no
    symlink costs one ``lstat``, where realpath walks every component of every folder again."""
    head, tail = os.path.split(directory)
    if not head or not tail or tail in (".", "..") or head == directory or os.path.islink(directory):
        return os.path.realpath(directory)
    return os.path.join(_real(head), tail)


def discover_models(paths: Iterable[str | os.PathLike[str]]) -> list[LocalModel]:
    """Every model directory under the given files and directories.

    A file stands for the model of its directory (pre-commit passes subsets of
    shards; the siblings are read from disk).  A path that does not exist is a
    UsageError (exit 2).
    """
    directories: dict[str, set[str]] = {}
    listed: dict[str, list[os.DirEntry[str]]] = {}  # the walk's own listing of a folder, not listed twice
    for raw in paths:
        path = clean_path(raw)
        if not os.path.lexists(path):
            raise UsageError(f"{os.fspath(raw)}: no such file or directory")
        package = enclosing_package(path)  # a Core ML package, or a file in one, stands for the package
        if package is not None:
            directories.setdefault(path_parent(package), set()).add(path_name(package))
        elif os.path.isdir(path):
            for directory, entries in _walk(path):
                if not _may_hold_a_model(entries):
                    continue  # nothing in it can be weights, an index or an Orbax checkpoint
                home = tf_dirs.model_dir(directory)  # variables/ is its SavedModel's
                directories.setdefault(home, set())
                if home == directory:
                    listed[directory] = entries
        else:
            directories.setdefault(tf_dirs.model_dir(path_parent(path)), set()).add(path_name(path))
    models = []
    for directory, named in directories.items():
        model = _local_model(directory, named, listed.get(directory))
        if (model.weight_files or model.orbax or model.training
                or any(is_index_file(path_name(p)) for p in model.json_files)):
            models.append(model)
    roots = [m.directory for m in models if m.orbax]  # nothing inside an Orbax checkpoint
    # nor inside a folder a training checkpoint claims (a claimed name ending in "/": DeepSpeed's universal zero/)
    owned = [os.path.join(t.directory, c.rstrip("/")) for m in models for t in m.training
             for c in t.claimed if c.endswith("/")]
    if owned:
        models = [m for m in models if not any(m.directory == o or _inside(m.directory, o) for o in owned)]
    return [m for m in models if not any(_inside(m.directory, r) for r in roots)] if roots else models


def _inside(path: str, root: str) -> bool:
    """``Path(root) in Path(path).parents`` for clean paths."""
    if root == ".":
        return not path.startswith("/") and path != "."
    return path != root and path.startswith(root if root.endswith("/") else root + "/")


def _walk(root: str) -> Iterator[tuple[str, list[os.DirEntry[str]]]]:
    """Each folder under ``root`` (itself first, then its subfolders by name, depth first, as ``os.walk``
    goes) with its entries: one ``scandir`` per folder, whose entries carry their type (``d_type``),
    so telling files from folders costs no ``stat``.  Symlinked folders are not entered."""
    stack = [root]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as listing:
                entries = list(listing)
        except OSError as exc:
            raise UsageError(f"{exc.filename or current}: cannot read directory ({exc.strerror})") from None
        yield current, entries
        subdirs = sorted(e.name for e in entries if e.name not in SKIP_DIRS and e.is_dir(follow_symlinks=False)
                         and not is_package(e.name) and not e.name.startswith(FIX_STAGING_PREFIX))
        stack.extend(os.path.join(current, name) for name in reversed(subdirs))


def _may_hold_a_model(entries: list[os.DirEntry[str]]) -> bool:
    """Whether a walked folder needs a closer look: any entry not known by its suffix alone to be
    something else (a source file, an image, a JSON file other than an index or config.json)."""
    for entry in entries:
        name = entry.name
        dot = name.rfind(".")
        ext = name[dot + 1:].lower() if dot >= 0 else ""
        if ext not in _NOT_WEIGHTS or ext in _SPECIAL_SUFFIXES:
            return True  # weights by suffix, a file to sniff, a folder, a marker (_METADATA), a TF shard, an IR
        if ext == "json" and _is_model_json(name):
            return True
    return False


def _is_model_json(name: str) -> bool:
    """config.json or a shard index (every index convention's name holds ``.index.``); the quantization configs;
    the generation config and the tokenizer's files CG128 compares (chat_template.jinja among them)."""
    return (name == CONFIG_NAME or name in QUANT_CONFIG_FILES or name in TOKEN_FILES
            or (".index." in name and is_index_file(name)))


def _local_model(directory: str, named: set[str], entries: list[os.DirEntry[str]] | None = None) -> LocalModel:
    if entries is None:
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError as exc:
            raise UsageError(f"{display_path(directory)}: cannot read directory ({exc.strerror})") from None
    entries = sorted(entries, key=lambda e: e.name)
    weights, jsons = [], []
    special = False  # IR pairs, Core ML packages, TF bundles: the passes below look only when named so
    for entry in entries:
        name = entry.name
        dot = name.rfind(".")
        ext = name[dot + 1:].lower() if dot >= 0 else ""
        if ext in _SPECIAL_SUFFIXES or ".data-" in name:
            special = True
        if ext in _NOT_WEIGHTS and name not in named:
            # known by its suffix not to be weights: no stat, no open (config.json and indexes aside)
            if _is_model_json(name) and entry.is_file():
                jsons.append(entry.path)
            continue
        if not entry.is_file():
            continue
        if _is_model_json(name):
            jsons.append(entry.path)
        elif is_weight_file(name) or _sniffs_as_weights(entry) or (name in named and ext != "json"):
            weights.append(entry.path)
    orbax = _orbax(directory, entries)  # a named _METADATA is the checkpoint's, not weights
    weights = [w for w in weights if is_weight_file(path_name(w))] if orbax else weights
    if special:
        weights = local_weights(directory, entries, weights)  # IR pairs and Core ML packages
        weights = tf_dirs.local_weights(directory, entries, weights)  # TF bundles and SavedModels
    training = _training(directory, entries)
    if training:  # the files a training checkpoint owns are read with it, not as weights of their own
        claimed = {name for found in training for name in found.claimed}
        weights = [w for w in weights if path_name(w) not in claimed]
    return LocalModel(directory, tuple(weights), tuple(jsons), orbax, training)


def _training(directory: str, entries: list[os.DirEntry[str]]) -> tuple[TrainingDir, ...]:
    """The training checkpoints the directory holds (guard.training.dirs), asked only where a trainer's marker is."""
    if not has_training_marker(e.name for e in entries):
        return ()
    from guard.training.dirs import claim_training_dirs

    return claim_training_dirs(directory, frozenset(e.name for e in entries if e.is_file()))


# Every suffix either pass above looks for (package_dirs: .xml, .mlpackage; tf_dirs: .index, .pb,
# .pbtxt and data shards): a folder with none of them skips both.
_SPECIAL_SUFFIXES = frozenset({"xml", "mlpackage", "index", "pb", "pbtxt"})


_ORBAX_MARKERS = frozenset({"_METADATA", "_CHECKPOINT_METADATA"})


def _orbax(directory: str, entries: list[os.DirEntry[str]]) -> tuple[str, ...]:
    """The directory itself if it is an Orbax checkpoint (guard.inventory.orbax_dirs), else ()."""
    if not any(e.name in _ORBAX_MARKERS for e in entries):
        return ()
    from guard.inventory.orbax_dirs import local_orbax

    return local_orbax(directory, entries)


def _sniffs_as_weights(entry: os.DirEntry[str]) -> bool:
    """Only a file whose suffix says nothing is stat'ed (its size) and opened (its first 16 bytes)."""
    try:
        if not may_be_weights(entry.name, entry.stat().st_size):
            return False
        with open(entry.path, "rb") as fh:
            return head_is_weights(fh.read(16))
    except OSError:
        return False


def may_be_weights(name: str, size: int | None) -> bool:
    """A file without a weight suffix worth sniffing: not text by its suffix, and large enough."""
    suffix = name.rpartition(".")[2].lower() if "." in name else ""
    return suffix not in _NOT_WEIGHTS and name != PIPELINE_INDEX and size is not None and size >= SNIFF_MIN_BYTES


def head_is_weights(head: bytes) -> bool:
    """The first 16 bytes of a weight format (GGUF, HDF5, NumPy, legacy torch, safetensors)."""
    if head.startswith(_WEIGHT_MAGIC):
        return True
    length = int.from_bytes(head[:8], "little") if len(head) >= 10 else 0
    return 2 <= length < 100 * 2**20 and head[8:10] == b'{"'  # a safetensors header


def load_local_model(model: LocalModel) -> ModelInventory:
    scans = []
    for path in model.weight_files:
        scans.append(scan_local_file(path))
        settle(scans[-1].format)  # the command line's own process: its records out of the collector's reach
    if model.orbax:
        from guard.inventory.orbax_dirs import scan_local_orbax

        scans += [scan_local_orbax(d, name=display_path(d)) for d in model.orbax]
    if model.training:
        from guard.training.dirs import scan_training_dir

        for found in model.training:
            scans.append(scan_training_dir(found, name=display_path(found.directory)))
            settle(scans[-1].format)
    scans = tf_dirs.rebase_companions(scans, display_path(model.directory))  # a SavedModel's variables/
    opened: list[LocalFile] = []
    try:
        json_files = {display_path(p): _json_data(p, opened) for p in model.json_files}
        return build_inventory(display_path(model.directory), scans, json_files=json_files,
                               companion_size=lambda name: _size(os.path.join(model.directory, name)))
    finally:
        for source in opened:
            source.close()


STREAMED_INDEX_BYTES = 1 << 20  # a larger index (~13,000 tensors and up) is compared from its file, not read whole


def _json_data(path: str, opened: list[LocalFile]) -> bytes | ByteSource | None:
    """A JSON file's bytes; a large shard index's open file instead (closed by the caller), which the index
    proof reads a chunk at a time (a 200,000-tensor index is 16 MB: held whole, a sixth of the scan's peak)."""
    if path_name(path) == TOKENIZER:  # tens of MB: only the head, where its added tokens are, is read
        try:
            opened.append(LocalFile(path, name=display_path(path)))
            return opened[-1]
        except OSError:
            return None
    if is_index_file(path_name(path)):
        try:
            if os.stat(path).st_size > STREAMED_INDEX_BYTES:
                opened.append(LocalFile(path, name=display_path(path)))
                return opened[-1]
        except OSError:
            pass  # read_small_file says it could not be read
    return read_small_file(path)


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size if os.path.isfile(path) else None
    except OSError:
        return None


_SAFETENSORS_AHEAD = 1 << 14  # a safetensors header of up to ~150 tensors comes with the sniff's read


def scan_local_file(path: str | os.PathLike[str]) -> FileScan:
    path = clean_path(path)
    name = display_path(path)
    if is_package(path_name(path)):
        return scan_local_package(path, name=name)
    try:
        source = LocalFile(path, name=name, read_ahead=_SAFETENSORS_AHEAD if path.endswith(".safetensors") else 0)
    except OSError as exc:
        return unreadable(BytesSource(b"", name=name), f"cannot open file ({exc.strerror})")
    with source:
        try:
            return scan_weight(source)
        except OSError as exc:
            return unreadable(source, f"read failed ({exc.strerror})")


def scan_weight(source: ByteSource) -> FileScan:
    """Read a weight file's headers; a format no reader handles is CG006, named, not skipped."""
    ext = source.name.rpartition(".")[2].lower() if "." in source.name else ""
    kind = UNSUPPORTED_SUFFIXES.get(ext)
    if kind is not None:
        try:
            known = sniff_format(source)
        except READ_FAILURES:
            known = None
        if known is None or (known == "torch-zip" and ext in ("npz", "keras")):  # zips, but not torch's
            finding = make_finding("CG006", source.name, f"{kind} weights: no reader in this version of "
                                   "ckpt-guard handles this format, so the file was not scanned")
            return FileScan(path=source.name, format=None, size=source.size, findings=(finding,),
                            metadata={"unsupported": kind}, bytes_read=getattr(source, "bytes_read", 0))
    return scan_file(source)


def read_small_file(path: str | os.PathLike[str]) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_JSON_BYTES + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_JSON_BYTES else b"\xff"  # oversized -> reported as invalid JSON
