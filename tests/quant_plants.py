"""Planted defects on real quantized output: each edits one folder written by ``quant_writers`` in place
and returns the tensor (or config key) it broke, for the finding to name.

Which tensor is a module's payload and which its scale is read from the writers' observed names
(the table below), never guessed from substrings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# most specific first: "weight._data._data" before "weight._data" before "weight"
PAYLOADS = ("W_q", "qweight", "weight_packed", "weight._data._data", "weight._data", "_weight_qdata",
            "gate_up_proj_blocks", "down_proj_blocks", "weight")
SCALES = ("weight.absmax", "SCB", "scale", "scales", "weight_scale_inv", "weight_scale", "weight_scales",
          "weight._scale", "_weight_scale", "down_proj_scales")
MODULES = ("model.layers.0.mlp.down_proj", "model.layers.0.mlp.experts")


def _tensors(folder: Path) -> dict[str, Path]:
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            where.update(dict.fromkeys(handle.keys(), path))  # noqa: SIM118
    return where


def _find(folder: Path, roles: tuple[str, ...]) -> str:
    names = _tensors(folder)
    for module in MODULES:
        for role in roles:
            if f"{module}.{role}" in names:
                return f"{module}.{role}"
    raise LookupError(f"no tensor of {roles} in {folder}")


def _rewrite(folder: Path, name: str, edit: Callable[[Any], Any | None]) -> str:
    """Rewrite the file holding ``name`` with ``edit(tensor)`` in its place (None drops it), metadata kept."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = _tensors(folder)[name]
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(path))
    replaced = edit(tensors.pop(name))
    if replaced is not None:
        tensors[name] = replaced
    temp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(temp), metadata=metadata)
    temp.replace(path)
    return name


def plant_missing_scale(folder: Path) -> str:
    """Drop one quantized module's scale tensor (absmax, SCB, scale(s), weight_scale(_inv), _scale)."""
    return _rewrite(folder, _find(folder, SCALES), lambda tensor: None)


def plant_truncated_payload(folder: Path) -> str:
    """Keep the first half of one packed payload's rows: a valid file whose shape disagrees."""
    return _rewrite(folder, _find(folder, PAYLOADS), lambda tensor: tensor[: tensor.shape[0] // 2].clone())


def plant_nan_scales(folder: Path) -> str:
    """NaN into a float scale; 0xFF (E8M0's NaN) into a uint8 exponent scale (MXFP4, MLX mxfp4)."""

    def poison(tensor: Any) -> Any:
        tensor = tensor.clone()
        tensor.view(-1)[0] = float("nan") if tensor.is_floating_point() else 0xFF
        return tensor

    name = _find(folder, SCALES)
    nested = f"{name.rsplit('.', 1)[0]}.nested_absmax"  # double quant: absmax holds U8 codes, its floats are here
    name = nested if name.endswith("weight.absmax") and nested in _tensors(folder) else name
    return _rewrite(folder, name, poison)


def plant_corrupt_quant_state(folder: Path) -> str:
    """Overwrite one bitsandbytes quant_state JSON blob with bytes that are not JSON (length kept)."""
    import torch

    names = [n for n in _tensors(folder) if ".quant_state.bitsandbytes__" in n]
    if not names:
        raise LookupError(f"no bitsandbytes quant_state in {folder}")
    return _rewrite(folder, sorted(names)[0],
                    lambda tensor: torch.full_like(tensor, 0xFF).index_fill_(0, torch.tensor([0]), ord("{")))


def plant_wrong_bits(folder: Path) -> str:
    """Declare other bits than the payloads have (4 <-> 8) wherever this method's config says them."""
    flip = {4: 8, 8: 4, 2: 4}
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    quant = config.get("quantization_config") or {}
    changed = ""
    if "bits" in quant:  # GPTQ, AWQ, MLX's copy
        quant["bits"], changed = flip[quant["bits"]], "quantization_config.bits"
        if "quantization" in config:
            config["quantization"]["bits"] = quant["bits"]
    elif "weight_quant_params" in quant.get("quant_config", {}):  # HQQ
        params = quant["quant_config"]["weight_quant_params"]
        params["nbits"], changed = flip[params["nbits"]], "quantization_config.quant_config.weight_quant_params.nbits"
    elif "config_groups" in quant:  # compressed-tensors
        for group in quant["config_groups"].values():
            group["weights"]["num_bits"] = flip.get(group["weights"]["num_bits"], 4)
        changed = "quantization_config.config_groups.*.weights.num_bits"
    elif quant.get("quant_method") == "bitsandbytes":
        four = bool(quant.get("load_in_4bit"))
        for key in ("load_in_4bit", "_load_in_4bit"):
            quant[key] = not four
        for key in ("load_in_8bit", "_load_in_8bit"):
            quant[key] = four
        changed = "quantization_config.load_in_4bit"
    elif (folder / "quanto_qmap.json").exists():
        qmap = json.loads((folder / "quanto_qmap.json").read_text())
        swap = {"qint4": "qint8", "qint8": "qint4", "qint2": "qint4", "qfloat8_e4m3fn": "qint4"}
        for record in qmap.values():
            record["weights"] = swap.get(record["weights"], record["weights"])
        (folder / "quanto_qmap.json").write_text(json.dumps(qmap, indent=4))
        return "quanto_qmap.json"
    else:
        raise LookupError(f"no bits to change in {config_path}")
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return changed
