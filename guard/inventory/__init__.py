"""The inventory: one model directory's files, grouped into weight sets.

``conventions`` is the literal table of file-name conventions (pattern -> role,
layout, variant); ``sets`` groups a directory's files into loadable copies and
picks the primary one; ``model`` is the ModelInventory the rules read;
``discovery`` finds model directories on disk; ``pipelines`` reads diffusers'
``model_index.json``.  May import the readers, sources, tensors and catalogue;
never the rules, the report or the CLI.
"""

from __future__ import annotations

from guard.inventory.discovery import (
    LocalModel,
    discover_models,
    display_path,
    load_local_model,
    read_small_file,
    scan_local_file,
    scan_weight,
)
from guard.inventory.model import (
    CONFIG_NAME,
    MAX_JSON_BYTES,
    PIPELINE_INDEX,
    ModelInventory,
    build_inventory,
    is_index_file,
    is_weight_file,
    line_in_json,
)
from guard.inventory.sets import WeightSet
from guard.inventory.stats import ConfigDtype, DtypeStats, ShardIndex

__all__ = [
    "CONFIG_NAME", "MAX_JSON_BYTES", "PIPELINE_INDEX", "ConfigDtype", "DtypeStats", "LocalModel", "ModelInventory",
    "ShardIndex", "WeightSet", "build_inventory", "discover_models", "display_path", "is_index_file",
    "is_weight_file", "line_in_json", "load_local_model", "read_small_file", "scan_local_file", "scan_weight",
]
