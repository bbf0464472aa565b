"""A row of the table for the file's own config: the class built from config.json on the meta device.

The table's rows are generated from each type's default config (``scripts/architectures_table.py``), and
say which config fields change which modules exist (``Row.flags``).  Where config.json sets one of them
otherwise (Falcon-40B's ``new_decoder_architecture``, biases on, q/k norms, dense first layers), the row
cannot vouch for the file; this module builds the class itself from that config, where transformers is
installed, and reads what it builds: names and shapes (concrete), non-persistent buffers, the ties as
transformers resolves them for that config, its load-time conversions, its sub-models.

The build runs in a subprocess (``python -m guard.inventory.build_rows CLASS < config.json``): the scan's
process never imports torch or transformers.  Its answer is cached in the user's cache
(``cache_root()/rows/KEY.json``, ``guard.envs.home``), keyed by the config's text, the class and the
installed transformers' version, so a repository's hook pays for it once per config.  Where transformers
is not installed, or the build fails, the answer is a reason (the rules say the check did not run, CG127).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

BUILD_TIMEOUT = 300.0  # seconds: a 100-layer class on the meta device takes a few
NO_BUILD_ENV = "CKPT_GUARD_NO_BUILD"  # set: never build (a row that cannot vouch is a note)
_FORMAT = 2  # the cached answer's format and the build's reading of the config: a change is another key


def transformers_version() -> str | None:
    """The installed transformers' version, without importing it (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def cache_key(config: Mapping[str, object], class_name: str, version: str) -> str:
    import hashlib

    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{_FORMAT}\0{version}\0{class_name}\0{text}".encode()).hexdigest()[:32]


def built_row(config: Mapping[str, object], class_name: str) -> object | str:
    """The Row ``class_name`` builds for ``config`` (config.json's dict), from the cache or a build in a
    subprocess; or why there is none."""
    from guard.inventory.rows import row_from_json

    if os.environ.get(NO_BUILD_ENV):
        return f"building {class_name} from config.json is turned off ({NO_BUILD_ENV})"
    version = transformers_version()
    if version is None:
        return "transformers is not installed to build it from config.json"
    from guard.inventory.rows import figures, index

    known = figures().get("known_types")
    model_type = config.get("model_type")
    if index().get("version") == version and isinstance(known, list) and model_type not in known:
        return f"transformers {version} has no model_type {model_type!r} (a model of remote code?)"
    from guard.envs.home import cache_root

    folder = cache_root() / "rows"
    path = folder / f"{cache_key(config, class_name, version)}.json"
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cached = None
    if not isinstance(cached, dict):
        cached = _build_in_subprocess(config, class_name)
        if isinstance(cached, str):
            return cached
        try:
            folder.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(cached), encoding="utf-8")
            os.replace(temporary, path)
        except OSError:
            pass  # a read-only cache: answered, not kept
    if "error" in cached:
        return f"transformers {version} could not build {class_name} from config.json ({cached['error']})"
    return row_from_json(cached)


def _build_in_subprocess(config: Mapping[str, object], class_name: str) -> dict[str, Any] | str:
    import subprocess

    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run([sys.executable, "-m", "guard.inventory.build_rows", class_name],
                              input=json.dumps(config, default=str), capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"building {class_name} from config.json failed ({type(exc).__name__})"
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return f"building {class_name} from config.json failed ({last})"
    if answer.get("error", "").startswith("transient:"):
        return f"building {class_name} from config.json failed ({answer['error']})"  # not cached
    return answer


# --- in the subprocess (or the generator): transformers and torch imported ---------------------------------

def config_object(config: Mapping[str, object]) -> Any:
    """transformers' config for config.json's dict, as from_pretrained reads it: its model_type's class, the
    special floats decoded (``{"__float__": "Infinity"}``: nemotron_h's time_step_limit), ``from_dict``."""
    from transformers import CONFIG_MAPPING

    values = {k: v for k, v in config.items() if k != "transformers_version"}
    model_type = values.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise LookupError(f"model_type {model_type!r} is not one transformers knows")
    cls: Any = CONFIG_MAPPING[model_type]
    decode = getattr(cls, "_decode_special_floats", None)
    if decode is not None:
        values = decode(values)
    return cls.from_dict(values)


def build(class_name: str, config: Any) -> Any:
    """The class built on the meta device for a transformers config object."""
    import torch
    import transformers

    cls = getattr(transformers, class_name, None)
    if cls is None:
        raise LookupError(f"transformers has no class {class_name}")
    with torch.device("meta"):
        return cls(config)


def conversions(model: Any) -> tuple[list[tuple[str, str]], list[tuple[tuple[str, ...], str, int | None]], list[str]]:
    """The load-time renames and per-expert merges transformers applies to this model's file names."""
    from transformers.conversion_mapping import get_model_conversion_mapping

    notes: list[str] = []
    renames: list[tuple[str, str]] = []
    experts: list[tuple[tuple[str, ...], str, int | None]] = []
    try:
        transforms = get_model_conversion_mapping(model)
    except Exception as exc:  # noqa: BLE001  a model the mapping cannot walk: no conversions copied
        return [], [], [f"conversion mapping: {type(exc).__name__}"]
    for transform in transforms:
        kind = type(transform).__name__
        sources, targets = list(transform.source_patterns), list(transform.target_patterns)
        if kind == "WeightRenaming" and len(targets) == 1:
            renames.extend((source, targets[0]) for source in sources if (source, targets[0]) not in renames)
        elif kind == "WeightConverter" and len(targets) == 1:
            operations = getattr(transform, "operations", ())
            ops = [type(op).__name__ for op in operations]
            concat = next((op.dim for op in operations if type(op).__name__ == "Concatenate"), None)
            if ops in (["MergeModulelist"], ["MergeModulelist", "Concatenate"]):
                entry = (tuple(sources), targets[0], concat)
                if entry not in experts:
                    experts.append(entry)
            else:
                notes.append(f"converter {sources} -> {targets} ({ops}) not copied")
        else:
            notes.append(f"{kind} {sources} -> {targets} not copied")
    return renames, experts, notes


def sub_models(model: Any) -> list[tuple[str, str]]:
    """(prefix, config key) of each sub-model the class builds from a sub-config (vision_config, ...)."""
    from transformers import PreTrainedModel

    config = model.config
    keys = {id(getattr(config, k)): k for k in getattr(config, "sub_configs", {}) or {}
            if getattr(config, k, None) is not None}
    found: list[tuple[str, str]] = []
    for prefix, module in model.named_modules():
        if prefix and isinstance(module, PreTrainedModel) and id(module.config) in keys:
            if not any(prefix.startswith(p + ".") for p, _ in found):
                found.append((prefix, keys[id(module.config)]))
    return found


def tied_names(model: Any) -> set[str]:
    """The names transformers ties for the model's config (their tensors need not be in the file)."""
    try:
        return set(model.get_expanded_tied_weights_keys(all_submodels=True))
    except Exception:  # noqa: BLE001  an old-style mapping: the state dict's aliases say it
        return set()


def ignore_keys(model: Any) -> tuple[list[str], list[str]]:
    """The patterns transformers leaves out of its loading report (``_adjust_missing_and_unexpected_keys``): the
    model's own ``_keys_to_ignore_on_load_*`` (post_init gathers its children's), and the old persistent buffers
    it drops where the model holds them non-persistent (``rotary_emb.inv_freq``, ``position_ids``)."""
    missing = sorted(getattr(model, "_keys_to_ignore_on_load_missing", None) or ())
    unexpected = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    buffers = [name for name, _ in model.named_buffers()]
    if any(name.endswith("rotary_emb.inv_freq") for name in buffers):
        unexpected.add(r"rotary_emb\.inv_freq")
    if any(name.endswith("position_ids") for name in buffers):
        unexpected.add(r"(^|\.)position_ids$")
    return missing, sorted(unexpected)


def concrete(class_name: str, model: Any) -> dict[str, Any]:
    """The row of a built model: every name with its concrete shape (the ``built`` source)."""
    state = model.state_dict()
    shapes = {k: list(v.shape) for k, v in state.items()}
    unique = {k for k, _ in model.named_parameters()} | {k for k, _ in model.named_buffers()}
    aliases = (set(shapes) - unique) | (tied_names(model) & set(shapes))
    buffers = {k: list(v.shape) for k, v in model.named_buffers() if k not in shapes}  # non-persistent
    renames, experts, notes = conversions(model)
    missing, unexpected = ignore_keys(model)
    prefix = getattr(model, "base_model_prefix", "") or ""
    base = getattr(model, prefix, None) if prefix else None
    return {
        "prefix": prefix, "base": type(base).__name__ if base is not None else "",
        "tied": [], "aliases": sorted(aliases), "tie_default": False,
        "flat": [[k, v] for k, v in sorted(shapes.items())], "containers": {}, "expert_count": None,
        "renames": renames, "experts": [[list(s), t, d] for s, t, d in experts],
        "ignore_unexpected": unexpected, "ignore_missing": missing,
        "buffers": [[k, v] for k, v in sorted(buffers.items())], "flags": {},
        "sub_models": sub_models(model), "tie_key": "tie_word_embeddings", "source": "built", "notes": notes,
        "class_name": class_name,
    }


def main(argv: list[str]) -> int:
    """Build ``argv[0]`` from the config.json on stdin; print its row as one JSON line."""
    import warnings

    warnings.filterwarnings("ignore")
    config = json.loads(sys.stdin.read())
    try:
        model = build(argv[0], config_object(config))
        answer: dict[str, Any] = concrete(argv[0], model)
    except MemoryError:
        answer = {"error": "transient: out of memory"}
    except Exception as exc:  # noqa: BLE001  the config's own fault, kept as the answer for this config
        answer = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
