"""What parity reads from a model directory before running it: its config, its stored dtype, its depth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guard import jsonload
from guard.catalogue import make_finding
from guard.inventory import discover_models, display_path, load_local_model
from guard.parity.runs import Failed, Unavailable


def stored_dtype(directory: Path) -> str:
    """The floating dtype holding most parameters, from the headers (F32 when none)."""
    from guard import dtypes

    models = [m for m in discover_models([directory]) if Path(m.directory) == Path(directory)]
    if not models:
        return "F32"
    summary = load_local_model(models[0]).dtype_summary()
    return next((code for code in summary if dtypes.is_float(code)), "F32")


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    try:
        config = jsonload.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Unavailable(f"{display_path(directory)} has no config.json") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Failed(make_finding("CG001", display_path(path), f"config.json is unreadable: {exc}")) from None
    if not isinstance(config, dict):
        raise Failed(make_finding("CG001", display_path(path), "config.json is not a JSON object"))
    return config


def layer_count(config: dict[str, Any]) -> int:
    for keys in (("num_hidden_layers",), ("n_layer",), ("encoder_layers", "decoder_layers"),
                 ("num_layers", "num_decoder_layers")):
        values = [config.get(k) for k in keys]
        if any(isinstance(v, int) for v in values):
            return sum(v for v in values if isinstance(v, int))
    return 0
