"""Keras 3 ``.keras``: a zip of metadata.json, config.json and model.weights.h5.

Keras 3 writes every member stored (``zipfile.ZipFile`` default), so the h5
member is read in place through a byte-range view: one central-directory read
(by its declared size, as zipfile reads it, whatever count the end record gives),
the two small JSON members, then the HDF5 object headers.  A deflated
``model.weights.h5`` (re-zipped by another tool) is inflated into memory up to
``MAX_INFLATED_WEIGHTS``; past that it is CG006 (re-save it with Keras).

The model's dtype policy is the declared dtype (``metadata["declared_dtype"]``):
the *variable* dtype of the policy, since that is what the weights hold:
``float32``, ``mixed_float16`` and ``mixed_bfloat16`` all store F32 variables
(the mixed policies only compute in 16 bits); ``bfloat16`` / ``float16`` store
BF16 / F16.  Quantized policies (``QuantizedDTypePolicy``) declare none.  Each
layer's own policy is a declaration about its variables too
(``metadata["keras_layer_dtypes"]``, ``layer_policies``), judged by CG103 in
``guard.rules.config_dtype``.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter

from guard import dtypes, jsonload
from guard.catalogue import make_finding
from guard.errors import MalformedCheckpoint
from guard.readers.binary.zipdir import MemberSource, ZipEntry, open_member, read_member, read_zipfile_archive
from guard.readers.hdf5.file import INSTALL_HINT, have_h5py, walk_hdf5
from guard.sources import ByteSource, BytesSource
from guard.tensors import FileScan

WEIGHTS_MEMBER = "model.weights.h5"
MAX_ENTRIES = 10_000  # config, metadata, weights and assets/
MAX_JSON = 8 * 1024 * 1024  # a large Keras model's config.json is a few hundred KB
MAX_INFLATED_WEIGHTS = 64 * 1024 * 1024
MAX_NESTED_MODELS = 32  # models inside models in config.json: a hostile config is not walked deeper
# policy name -> the dtype its variables are stored in
POLICY_VARIABLE_DTYPES: dict[str, str] = {
    "float32": "F32", "mixed_float16": "F32", "mixed_bfloat16": "F32",
    "float16": "F16", "bfloat16": "BF16", "float64": "F64",
}


def read_keras(source: ByteSource) -> FileScan:
    # keras.saving.load_model opens the archive with zipfile: the directory is read as zipfile reads it
    entries = read_zipfile_archive(source).entries
    if len(entries) > MAX_ENTRIES:
        raise MalformedCheckpoint(f"{len(entries):,} zip entries: more than a .keras archive holds")
    metadata = _keras_metadata(source, entries)
    if WEIGHTS_MEMBER not in entries:
        other = "model.weights.npz" if "model.weights.npz" in entries else None
        if other is None:
            raise MalformedCheckpoint(f"no {WEIGHTS_MEMBER} in the .keras archive")
        return _unsupported(source, f"{other} (Keras' npz weights format) is not read; "
                                    "re-save with the default h5 weights", metadata)
    entry = entries[WEIGHTS_MEMBER]
    if not have_h5py():
        return _unsupported(source, f"a .keras archive; reading its {WEIGHTS_MEMBER} needs h5py: "
                                    f"{INSTALL_HINT}", metadata)
    start = open_member(source, entry, zipfile_checks=True)
    if entry.method == 0:
        view: ByteSource = MemberSource(source, start, entry.size, f"{source.name}!{WEIGHTS_MEMBER}")
    elif max(entry.size, entry.compressed_size) > MAX_INFLATED_WEIGHTS:
        return _unsupported(source, f"{WEIGHTS_MEMBER} is deflated ({entry.size:,} bytes inflated, over the "
                                    f"{MAX_INFLATED_WEIGHTS // 2**20} MiB in-memory bound); Keras writes it "
                                    "stored: re-save the model with Keras", metadata)
    else:
        view = BytesSource(read_member(source, entry, limit=MAX_INFLATED_WEIGHTS, zipfile_checks=True),
                           name=f"{source.name}!{WEIGHTS_MEMBER}")
    scan = walk_hdf5(view, fmt="keras", path=source.name)
    return FileScan(path=source.name, format="keras", size=source.size, tensors=scan.tensors,
                    findings=scan.findings, metadata={**scan.metadata, **metadata},
                    bytes_read=getattr(source, "bytes_read", 0))


def _unsupported(source: ByteSource, message: str, metadata: dict[str, str]) -> FileScan:
    return FileScan(path=source.name, format=None, size=source.size, metadata=metadata,
                    findings=(make_finding("CG006", source.name, message),),
                    bytes_read=getattr(source, "bytes_read", 0))


def _keras_metadata(source: ByteSource, entries: dict[str, ZipEntry]) -> dict[str, str]:
    out: dict[str, str] = {}
    try:  # informational, and keras.saving.load_model does not read it: a broken one is left out
        meta = _json_member(source, entries["metadata.json"]) if "metadata.json" in entries else None
    except MalformedCheckpoint:
        meta = None
    if isinstance(meta, dict) and isinstance(meta.get("keras_version"), str):
        out["keras_version"] = meta["keras_version"][:50]
    if "config.json" not in entries:
        raise MalformedCheckpoint("no config.json in the .keras archive")
    config = _json_member(source, entries["config.json"])
    if not isinstance(config, dict):
        raise MalformedCheckpoint("config.json is not a JSON object")
    out.update(declared_policy(config))
    layers = layer_policies(config)
    if layers:  # per layer, for CG103 (guard.rules.config_dtype.keras_layer_findings)
        out["keras_layer_dtypes"] = json.dumps(layers, separators=(",", ":"))
    return out


def declared_policy(config: dict[str, object]) -> dict[str, str]:
    """declared_dtype / declared_dtype_source (and keras_quantization) from a model config."""
    inner = config.get("config")
    if not isinstance(inner, dict):
        return {}
    where, name = "config.dtype", _policy_name(inner.get("dtype"))
    if name is None:  # Functional models record the policy per layer only
        layers = inner.get("layers")
        names = Counter(
            n for layer in layers if isinstance(layer, dict) and layer.get("class_name") != "InputLayer"
            and isinstance(layer.get("config"), dict) and (n := _policy_name(layer["config"].get("dtype")))
        ) if isinstance(layers, list) else Counter()
        if not names:
            return {}
        where, name = "config.layers[*].config.dtype", names.most_common(1)[0][0]
    if name.startswith("quantized:"):
        return {"keras_quantization": name.removeprefix("quantized:")[:50]}
    code = POLICY_VARIABLE_DTYPES.get(name) or dtypes.parse_dtype_name(name)
    source = f"config.json {where}: Keras dtype policy {name[:50]!r}"
    if code is None:
        return {"declared_dtype_source": source}
    return {"declared_dtype": code, "declared_dtype_source": source}


def layer_policies(config: dict[str, object], prefix: str = "layers/", depth: int = 0) -> dict[str, list[str]]:
    """{h5 group of a layer ("layers/dense/"): [its name, its policy, the dtype its variables are built in]}.

    Keras 3 builds each layer's variables in its own policy's variable dtype and casts stored
    values to it on load, so each layer's policy is a declaration about its variables.  The
    groups are named as ``saving_lib._save_container_state`` names them: the snake-cased class
    name, ``_1``, ``_2``, ... for repeats, in the order of the config's layers; a nested model's
    layers sit under ``<group>/layers/``; sublayers (MultiHeadAttention's ``query_dense``) share
    their layer's group prefix and policy.  Quantized and unknown policies declare nothing.
    """
    inner = config.get("config")
    layers = inner.get("layers") if isinstance(inner, dict) else None
    out: dict[str, list[str]] = {}
    if not isinstance(layers, list) or depth > MAX_NESTED_MODELS:
        return out
    used: dict[str, int] = {}
    for layer in layers:
        if not isinstance(layer, dict) or not isinstance(layer.get("class_name"), str):
            continue
        group = _snake_case(layer["class_name"])
        if group in used:
            used[group] += 1
            group = f"{group}_{used[group]}"
        else:
            used[group] = 0
        path = f"{prefix}{group}/"
        out.update(layer_policies(layer, f"{path}layers/", depth + 1))
        cfg = layer.get("config")
        if not isinstance(cfg, dict):
            continue  # no config: no dtype policy
        name = _policy_name(cfg.get("dtype"))
        code = POLICY_VARIABLE_DTYPES.get(name or "") or dtypes.parse_dtype_name(name or "")
        if layer["class_name"] != "InputLayer" and name and not name.startswith("quantized:") and code:
            out[path] = [str(cfg.get("name", group))[:100], name[:50], code]
    return out


def _snake_case(name: str) -> str:
    """keras.src.utils.naming.to_snake_case."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _policy_name(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if not isinstance(value, dict) or not isinstance(value.get("config"), dict):
        return None
    cfg = value["config"]
    if value.get("class_name") == "QuantizedDTypePolicy" or "mode" in cfg:
        return f"quantized:{cfg.get('mode')}"
    name = cfg.get("name")
    return name if isinstance(name, str) else None


def _json_member(source: ByteSource, entry: ZipEntry) -> object:
    if max(entry.size, entry.compressed_size) > MAX_JSON:
        raise MalformedCheckpoint(f"{entry.name} declares {entry.size:,} bytes, over the {MAX_JSON:,}-byte limit")
    raw = read_member(source, entry, limit=MAX_JSON, zipfile_checks=True)
    if zlib.crc32(raw) != entry.crc:  # small members are read whole: check them, as zipfile does
        raise MalformedCheckpoint(f"bad CRC-32 for {entry.name}")
    try:
        return jsonload.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedCheckpoint(f"{entry.name} is not valid JSON: {str(exc)[:100]}") from None
