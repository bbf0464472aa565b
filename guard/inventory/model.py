"""ModelInventory: one model directory's weight sets, shard indexes and config.json."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType

from guard import jsonload
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.findings import Finding
from guard.inventory.conventions import EXTENSION_FORMATS, UNSUPPORTED_SUFFIXES
from guard.inventory.names import classify
from guard.inventory.quant_conventions import QUANT_CONFIG_FILES
from guard.inventory.quantization import Quantization, set_quantization
from guard.inventory.sets import WeightSet, group_sets, mark_primary
from guard.inventory.stats import ConfigDtype, DtypeStats, ShardIndex
from guard.records import Record
from guard.sources import ByteSource, BytesSource
from guard.tensors import FileScan, TensorInfo

CONFIG_NAME = "config.json"
PIPELINE_INDEX = "model_index.json"  # diffusers: the pipeline root names its components
MAX_JSON_BYTES = 64 * 1024 * 1024  # index/config files are small; refuse to slurp a huge one
NO_QUANT_FILES: Mapping[str, object] = MappingProxyType({})
# what CG128 compares (guard.rules.eos): the generation config, the tokenizer's special tokens, the chat template
GENERATION_CONFIG, TOKENIZER_CONFIG, TOKENIZER, CHAT_TEMPLATE = (
    "generation_config.json", "tokenizer_config.json", "tokenizer.json", "chat_template.jinja")
TOKEN_FILES = frozenset({GENERATION_CONFIG, TOKENIZER_CONFIG, TOKENIZER, CHAT_TEMPLATE})
NO_TOKEN_FILES: Mapping[str, tuple[str, object]] = MappingProxyType({})


def is_weight_file(name: str) -> bool:
    """Weights by suffix: every format a reader handles, and those CG006 reports."""
    ext = name.rpartition(".")[2].lower() if "." in name else ""
    return ext in EXTENSION_FORMATS or ext in UNSUPPORTED_SUFFIXES


def is_index_file(name: str) -> bool:
    return classify(name).kind == "index"


class ModelInventory(Record):
    path: str  # the model directory, as displayed
    files: tuple[FileScan, ...] = ()
    indexes: tuple[ShardIndex, ...] = ()
    config_path: str | None = None
    config: dict[str, object] | None = None
    config_text: str = ""
    findings: tuple[Finding, ...] = ()  # inventory-level (bad JSON, ...)
    sets: tuple[WeightSet, ...] = ()
    quant_files: Mapping[str, object] = NO_QUANT_FILES  # quanto_qmap.json, quantize_config.json: file name -> JSON
    # TOKEN_FILES: file name -> (its path as displayed, its JSON object; tokenizer.json: its added tokens as
    # (id, content, special) triples; chat_template.jinja: its text)
    token_files: Mapping[str, tuple[str, object]] = NO_TOKEN_FILES

    @property
    def primary(self) -> WeightSet | None:
        return next((s for s in self.sets if s.primary), None)

    @property
    def tensors(self) -> Iterator[TensorInfo]:
        """Every tensor of every file (value scans read all copies); rules go set by set."""
        for scan in self.files:
            yield from scan.tensors

    def dtype_summary(self) -> dict[str, DtypeStats]:
        """The primary set's: the model-level counts are one copy's, never a sum over copies."""
        primary = self.primary
        return primary.dtype_summary() if primary is not None else {}

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

    def quantization(self, ws: WeightSet | None = None) -> Quantization | None:
        """The set's quantization (default: the primary set's), or None: see guard.inventory.quantization."""
        return set_quantization(self, ws if ws is not None else self.primary)

    @property
    def is_diffusers(self) -> bool:
        return _is_diffusers(self.config)


def _is_diffusers(config: object) -> bool:
    return isinstance(config, dict) and ("_diffusers_version" in config or "_class_name" in config)


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
    pattern = re.escape(jsonload.quoted(key)) + r"\s*:"  # quoted: json.dumps of a str
    if value is not None:
        pattern += r"\s*" + re.escape(jsonload.quoted(value))
    match = re.search(pattern, text)
    if match is None:
        return None
    return text.count("\n", 0, match.start()) + 1


def line_in_json(text: str, key: str) -> int | None:
    return _line_of(text, key)


def build_inventory(
    path: str,
    weight_scans: Iterable[FileScan],
    *,
    json_files: Mapping[str, bytes | ByteSource | None],
    companion_size: Callable[[str], int | None] | None = None,
) -> ModelInventory:
    """Assemble an inventory from already-read weight files and small JSON files.

    ``json_files`` maps display paths of index files and config.json to their
    bytes (None where the file could not be read; a large index may come as an open
    source, read a chunk at a time: see ``guard.inventory.index_proof``).  ``companion_size`` gives the
    size of a file beside them by its relative name (None: missing), for the files
    a weight file needs (ONNX external data).  Local and Hub scans share this, so
    the same files give the same sets and findings either way.
    """
    files = tuple(sorted(weight_scans, key=lambda s: s.path))
    findings: list[Finding] = []
    needed = {name for scan in files for name in scan.companions}
    if needed:  # a data file belongs to the file that needs it, not to a set of its own
        # only a file no reader took for a checkpoint: a data file named `pytorch_model.bin` is still read,
        # with its own findings (a hostile graph cannot hide a pickle by claiming it as its data)
        files = tuple(s for s in files if s.format is not None or posixpath.basename(s.path) not in needed)
        sizes = {name: companion_size(name) if companion_size else None for name in needed}
        findings.extend(companion_findings(files, sizes))
    indexes: list[ShardIndex] = []
    config_path: str | None = None
    config: dict[str, object] | None = None
    config_text = ""
    quant_files: dict[str, object] = {}
    token_files: dict[str, tuple[str, object]] = {}
    compared = any(os.path.basename(name) == GENERATION_CONFIG for name in json_files)  # what CG128 reads them for
    deferred: dict[str, bytes | ByteSource] = {}  # index -> its bytes, proven against its shards once sets are known
    marks: list[tuple[int, str]] = []
    for name, data in sorted(json_files.items()):
        base = os.path.basename(name)
        if data and is_index_file(base):  # bytes, or an open source (never empty: only a large index is one)
            deferred[name] = data
            marks.append((len(findings), name))  # where its findings go if it is parsed: file order, as before
            indexes.append(ShardIndex(name, NO_MAP))
            continue
        if base in (TOKENIZER, CHAT_TEMPLATE):  # read in part, or not JSON: their own reader, never a finding
            if data is not None and compared:
                from guard.inventory.tokens import read_token_file

                value = read_token_file(base, data)
                if value is not None:
                    token_files[base] = (name, value)
            continue
        parsed, text = _parse_json(name, _whole(data) if data is not None else None, findings)
        if base in TOKEN_FILES:
            if isinstance(parsed, dict):
                token_files[base] = (name, parsed)
        elif base == CONFIG_NAME:
            config_path, config_text = name, text
            if parsed is not None and not isinstance(parsed, dict):
                findings.append(make_finding("CG001", name, "config.json is not a JSON object"))
            elif parsed is not None:
                config = parsed
        elif base in QUANT_CONFIG_FILES:
            if parsed is not None:
                quant_files[base] = parsed
        elif is_index_file(base):
            indexes.append(_parsed_index(name, parsed, text, findings))
    sets = group_sets(files, indexes)
    if deferred:  # each index against its own set's shards: proven equal, or parsed as any other
        # the proof's name order is kept for the loading check only where it can run: config.json names the
        # model's class (guard.rules.loading.applies), else 200,000 names' order would outlive the proof for nothing
        named = isinstance(config, dict) and isinstance(config.get("architectures"), list)
        sets, indexes, found = _settle_indexes(files, sets, indexes, deferred, keep_order=named)
        for at, name in reversed(marks):
            findings[at:at] = found.get(name, ())
    marked = mark_primary(sets, diffusers=_is_diffusers(config))
    return ModelInventory(path, files, tuple(indexes), config_path, config, config_text, tuple(findings), marked,
                          MappingProxyType(quant_files) if quant_files else NO_QUANT_FILES,
                          MappingProxyType(token_files) if token_files else NO_TOKEN_FILES)


NO_MAP: Mapping[str, str] = MappingProxyType({})  # an index not yet proven or parsed (empty: joins no file)
UNUSABLE: Mapping[str, str] = MappingProxyType({})  # no map to read (CG001 or CG004 said why): nothing to check


def _parsed_index(name: str, parsed: object, text: str, findings: list[Finding]) -> ShardIndex:
    weight_map = _weight_map(parsed)
    if parsed is not None and weight_map is None:  # unparsable JSON: CG001 already; the index still stands
        findings.append(make_finding(
            "CG004", name, "shard index has no valid \"weight_map\" (tensor name -> shard file)"))
    return ShardIndex(name, weight_map if weight_map is not None else UNUSABLE, text)


def _settle_indexes(files: tuple[FileScan, ...], sets: list[WeightSet], indexes: list[ShardIndex],
                    deferred: dict[str, bytes | ByteSource], *, keep_order: bool = False
                    ) -> tuple[list[WeightSet], list[ShardIndex], dict[str, list[Finding]]]:
    """Each deferred index proven against its set's shards (``guard.inventory.index_proof``), else parsed.

    A proven index is valid JSON and agrees with its shards: it needs no parse, and CG004 has
    nothing to say of it.  Any other is parsed and judged exactly as before; if one is, the sets
    are grouped again (an index with no shards of its own may join the single file it names).
    ``keep_order``: each set keeps the names' order the proof worked out (``BY_NAME`` in its memo).
    """
    from guard.inventory.index_proof import HeaderMap, prove_index

    proven: dict[str, ShardIndex] = {}
    for ws in sets:
        for index in ws.indexes:
            data = deferred.get(index.path)
            source = BytesSource(data, name=index.path) if isinstance(data, bytes) else data
            if source is not None and prove_index(source, ws.files, ws.memo if keep_order else None):
                proven[index.path] = ShardIndex(index.path, HeaderMap(ws.files), "", True)
    settled = []
    found: dict[str, list[Finding]] = {}
    for index in indexes:
        if index.path in proven:
            settled.append(proven[index.path])
        elif index.path in deferred:
            findings = found[index.path] = []
            parsed, text = _parse_json(index.path, _whole(deferred[index.path]), findings)
            settled.append(_parsed_index(index.path, parsed, text, findings))
        else:
            settled.append(index)
    if len(proven) < len(deferred):
        return group_sets(files, settled), settled, found
    return [ws._replace(indexes=tuple(proven.get(i.path, i) for i in ws.indexes)) if ws.indexes else ws
            for ws in sets], settled, found


def _whole(data: bytes | ByteSource) -> bytes | None:
    """An index's bytes, read whole where it was handed over as an open file (as ``read_small_file`` reads)."""
    if isinstance(data, bytes):
        return data
    if data.size > MAX_JSON_BYTES:
        return b"\xff"  # oversized -> reported as invalid JSON
    try:
        return data.read_at(0, data.size)
    except (OSError, MalformedCheckpoint):
        return None


def _weight_map(parsed: object) -> dict[str, str] | None:
    """An index's ``weight_map`` if it maps names to file names, with each file name held once.

    JSON keys are strings already; the values are checked once per distinct shard, and each
    tensor's value becomes that shard's one string (200,000 tensors name 4,000 shards: 16 MB
    less for the run's life than one string per tensor).
    """
    weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
    if not isinstance(weight_map, dict):
        return None
    shards: dict[object, object] = {}
    try:
        held = list(map(shards.setdefault, weight_map.values(), weight_map.values()))
    except TypeError:  # a list or an object as a value: not a file name
        return None
    if not all(type(shard) is str for shard in shards):
        return None
    weight_map.update(zip(weight_map, held))  # same keys, in place: the map keeps its order and size
    return weight_map


def companion_findings(files: Iterable[FileScan], sizes: Mapping[str, int | None]) -> Iterator[Finding]:
    """A companion that is missing or too short for what its file places in it (CG004)."""
    for scan in files:
        if scan.companions and scan.format in ("onnx", "openvino"):  # an IR's .bin: checked as external data
            from guard.readers.onnx.tensors import external_data_findings  # only where ONNX files are

            yield from external_data_findings(scan, sizes)
        elif scan.companions and scan.format == "tf-bundle":  # the data shards of a TF bundle index
            from guard.readers.tf.bundle import shard_findings

            yield from shard_findings(scan, sizes)


def _parse_json(name: str, data: bytes | None, findings: list[Finding]) -> tuple[object | None, str]:
    if data is None:
        findings.append(make_finding("CG001", name, "file could not be read"))
        return None, ""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = ""  # the reader words it
    try:
        return jsonload.parse(text or data, name), text  # the one reader: a value, or its one-line error
    except ValueError as exc:
        findings.append(make_finding("CG001", name, f"not valid JSON: {jsonload.describe(exc)}"))
        return None, ""
