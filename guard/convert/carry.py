"""What travels with the weights: config.json with its dtype updated, and the other small files."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from guard import dtypes, jsonload
from guard.catalogue import make_finding
from guard.findings import Finding
from guard.inventory import is_index_file, is_weight_file

# Files of a training run beside its config.json (DeepSpeed's save folder, the Trainer's checkpoint-N/).
TRAINING_FILES = frozenset({"latest", "zero_to_fp32.py", "zero_to_torch.py", "trainer_state.json",
                            "latest_checkpointed_iteration.txt"})  # Megatron's save folder
TRAINING_SUFFIXES = (".distcp", ".metadata")  # PyTorch DCP's rank files and per-rank metadata (__R.metadata)

CONFIG_FILES = ("config.json", "generation_config.json")
DTYPE_KEYS = ("torch_dtype", "dtype")
_WEIGHTS = re.compile(r"\.(safetensors|bin|msgpack|pt|pth|ckpt|h5|onnx)$|\.index\.json$"
                      r"|^(_METADATA|_CHECKPOINT_METADATA|_sharding|commit_success\.txt|manifest\.ocdbt)$")  # Orbax


def read_config(src: Path) -> tuple[dict[str, Any] | None, list[Finding]]:
    """config.json as a dict (None if absent); a CG001 finding when it is not a JSON object."""
    path = src / "config.json"
    if not path.is_file():
        return None, []
    try:
        config = jsonload.loads(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        return config, []
    except (ValueError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0][:200]
        return None, [make_finding("CG001", str(path), f"config.json is not valid JSON: {reason}")]


def with_dtype(obj: Any, name: str) -> Any:
    """A copy with every torch_dtype / dtype field (nested configs too) set to ``name``."""
    if isinstance(obj, dict):
        out = {k: with_dtype(v, name) for k, v in obj.items()}
        for key in DTYPE_KEYS:
            if isinstance(obj.get(key), str):
                out[key] = name
        return out
    return obj


def main_dtype(counts: dict[str, int]) -> str | None:
    """The floating dtype holding most parameters, by its config.json name."""
    floats = {code: n for code, n in counts.items() if dtypes.is_float(code)}
    if not floats:
        return None
    return dtypes.DTYPES[max(floats, key=floats.__getitem__)].config


def carry_files(src: Path, dest: Path, *, config: dict[str, Any] | None, dtype_name: str | None) -> list[str]:
    """Copy config.json (dtype updated), generation_config.json and the tokenizer-like files."""
    carried = []
    if config is not None:
        if dtype_name:
            config = with_dtype(config, dtype_name)
            if not any(key in config for key in DTYPE_KEYS):
                config["torch_dtype"] = dtype_name
        (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        carried.append("config.json")
    for path in sorted(src.iterdir()):
        name = path.name
        if name == "config.json" or name.startswith(".") or not path.is_file() or _WEIGHTS.search(name):
            continue
        if name in TRAINING_FILES or name.endswith(TRAINING_SUFFIXES):  # a training run's `latest`, its scripts,
            continue  # its rank files: no part of the converted model
        if is_weight_file(name) or is_index_file(name):  # other copies and variants, in every naming
            continue
        if name == "generation_config.json" and dtype_name:
            try:
                data = jsonload.loads(path.read_text(encoding="utf-8"))
                (dest / name).write_text(json.dumps(with_dtype(data, dtype_name), indent=2, sort_keys=True) + "\n",
                                         encoding="utf-8")
                carried.append(name)
                continue
            except (ValueError, UnicodeDecodeError):
                pass  # copied as it is, like any other file
        shutil.copyfile(path, dest / name)  # a new file of the user's: the umask's mode, not the source's
        carried.append(name)
    return carried + carry_module_folders(src, dest)


def carry_module_folders(src: Path, dest: Path) -> list[str]:
    """The folders sentence-transformers' modules.json names (``1_Pooling/``, ``2_Dense/``, ``2_Normalize/``),
    copied whole: without them the model loads as a bare transformer, its pooling and normalisation gone.
    Only folders inside ``src``; links are not followed (a repository's link may point anywhere)."""
    try:
        modules = jsonload.loads((src / "modules.json").read_bytes())
    except (OSError, ValueError):
        return []  # none, or not JSON: then it names nothing (the file itself was copied as it is)
    folders = [m["path"] for m in modules if isinstance(m, dict) and isinstance(m.get("path"), str)
               and m["path"].strip("./")] if isinstance(modules, list) else []
    carried: list[str] = []
    root = src.resolve()
    for name in dict.fromkeys(folders):
        folder = src / name
        if folder.is_symlink() or not folder.is_dir() or not folder.resolve().is_relative_to(root) \
                or folder.resolve() == root or (dest / name).exists():
            continue
        shutil.copytree(folder, dest / name, copy_function=shutil.copyfile,  # the umask's modes, as above
                        ignore=lambda where, names: [n for n in names if os.path.islink(os.path.join(where, n))])
        carried.append(f"{Path(name).as_posix().rstrip('/')}/")
    return carried
